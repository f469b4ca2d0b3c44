// Admin sign-in through a real OpenID Provider, in a real browser: the system's headless
// Chromium driven by playwright-core, and panva's certified oidc-provider (tests/oidc-provider/
// op.mjs, its own login and consent pages) on loopback in development mode.
//
// Starts op.mjs and `toolgate serve --oidc-*` on free ports over a fresh database. alice
// (groups: toolgate-admins) signs in through the provider's pages and is an admin; bob
// (toolgate-auditors) is an auditor; eve's hostile preferred_username arrives sanitised and
// escaped; mallory (no mapped group) is refused with a clear page. alice disables bob on the
// accounts page: bob's open session stops working at once and signing in again is refused.
//
// Environment: TOOLGATE_BIN (default target/debug/toolgate), PG_BASE (default
// postgres://root@127.0.0.1:5432), CHROMIUM (default /usr/bin/chromium), SCREENSHOT_DIR.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { chromium } from "playwright-core";
import { bin, chromiumArgs, chromiumPath, cleanEnv, freePort, pgBase, root, shots, waitReady } from "./common.mjs";

const database = `toolgate_sso_${process.pid}_${Date.now()}`;
const databaseUrl = `${pgBase}/${database}`;
const clientSecret = "toolgate-test-secret";

/// Resolves with op.mjs's first stdout line (it prints it once it listens).
function startProvider(port, redirectUri, log) {
  const op = spawn(
    process.execPath,
    [path.join(root, "tests/oidc-provider/op.mjs"), "--port", String(port),
      "--redirect-uri", redirectUri, "--client-secret", clientSecret],
    { stdio: ["ignore", "pipe", fs.openSync(log, "w")] },
  );
  const ready = new Promise((resolve, reject) => {
    op.once("exit", (code) => reject(new Error(`op.mjs exited (${code}):\n${fs.readFileSync(log, "utf8")}`)));
    readline.createInterface({ input: op.stdout }).once("line", (line) => resolve(JSON.parse(line)));
  });
  return { op, ready };
}

test("admins sign in through an OpenID Provider, roles come from groups", { timeout: 180_000 }, async (t) => {
  fs.mkdirSync(shots, { recursive: true });
  const [port, opPort] = [await freePort(), await freePort()];
  const base = `http://127.0.0.1:${port}`;
  const issuer = `http://127.0.0.1:${opPort}`;
  const { op, ready } = startProvider(opPort, `${base}/admin/sso/callback`, path.join(shots, "op.log"));
  t.after(() => op.kill("SIGTERM"));
  assert.equal((await ready).issuer, issuer);

  const log = path.join(shots, "sso-server.log");
  const server = spawn(
    bin,
    ["serve", "--database-url", databaseUrl, "--bind", `127.0.0.1:${port}`,
      "--tools-dir", path.join(root, "tools"), "--policies-dir", path.join(root, "policies"),
      "--oidc-issuer", issuer, "--oidc-client-id", "toolgate", "--oidc-provider-name", "Test OP",
      "--oidc-scope", "profile,email,groups", "--oidc-role-claim", "groups",
      "--oidc-role-map",
      "toolgate-admins=admin,toolgate-auditors=auditor,toolgate-viewers=viewer,toolgate-members=member",
      // Approver sets come from the same claim: bob's `staff` group makes him a finance approver.
      "--oidc-approver-map", "staff=finance"],
    {
      // The secret comes from the environment, never a flag.
      env: { ...cleanEnv(), TOOLGATE_OIDC_CLIENT_SECRET: clientSecret },
      stdio: ["ignore", fs.openSync(log, "w"), fs.openSync(log, "a")],
    },
  );
  t.after(async () => {
    server.kill("SIGTERM");
    await new Promise((r) => (server.exitCode !== null ? r() : server.once("exit", r)));
    spawnSync("psql", [`${pgBase}/postgres`, "-qc", `DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`]);
  });
  await waitReady(base, server, log);

  const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: chromiumArgs,
  });
  t.after(() => browser.close());
  const dialogs = [];

  // A fresh browser (its own cookies) for one person.
  async function person() {
    const context = await browser.newContext();
    const page = await context.newPage();
    page.on("dialog", (d) => { dialogs.push(d.message()); d.dismiss(); });
    return page;
  }

  // From toolgate's sign-in page through the provider's login and consent pages and back.
  async function signIn(page, login) {
    await page.goto(`${base}/admin`);
    assert.match(page.url(), /\/admin\/login/);
    await page.click("#sso-sign-in");
    await page.waitForURL((u) => u.href.startsWith(issuer));
    await page.fill('input[name="login"]', login);
    await page.fill('input[name="password"]', "any password works at this provider");
    await page.click('button[type="submit"]');
    // Consent, the first time this account meets this client.
    await page.waitForURL((u) => !u.href.startsWith(issuer) || /consent|interaction/.test(u.href));
    if (page.url().startsWith(issuer)) {
      await page.click('button[type="submit"]');
    }
    // Back at toolgate: the callback's answer (a refusal, or the page that moves on to /admin).
    await page.waitForURL((u) => u.href.startsWith(base));
  }

  let alice;
  let bob;

  await t.test("alice, in toolgate-admins, becomes an admin", async () => {
    alice = await person();
    await signIn(alice, "alice");
    await alice.waitForURL(`${base}/admin`);
    assert.equal((await alice.locator(".who-name").textContent()).trim(), "alice");
    assert.equal((await alice.locator(".who .badge-role").textContent()).trim(), "admin");
    await alice.screenshot({ path: path.join(shots, "sso-admin.png"), fullPage: true });
  });

  await t.test("bob, in toolgate-auditors, becomes an auditor", async () => {
    bob = await person();
    await signIn(bob, "bob");
    await bob.waitForURL(`${base}/admin`);
    assert.equal((await bob.locator(".who .badge-role").textContent()).trim(), "auditor");
    // An auditor reads the audit log but changes nothing: no "New local account" form.
    await bob.goto(`${base}/admin/accounts`);
    assert.equal(await bob.locator("#new-account-heading").count(), 0);
    // His `staff` group maps to the `finance` approver set; alice's groups map to none.
    const sets = (user) => spawnSync("psql", [databaseUrl, "-tAc",
      `SELECT approver_sets FROM admin_users WHERE username = '${user}'`], { encoding: "utf8" }).stdout.trim();
    assert.equal(sets("bob"), "{finance}");
    assert.equal(sets("alice"), "{}");
  });

  await t.test("eve's hostile username is sanitised and shown as text", async () => {
    const eve = await person();
    await signIn(eve, "eve");
    await eve.waitForURL(`${base}/admin`);
    const name = (await eve.locator(".who-name").textContent()).trim();
    assert.match(name, /^[A-Za-z0-9_.@-]+$/);
    assert.equal((await eve.locator(".who .badge-role").textContent()).trim(), "viewer");
    assert.deepEqual(dialogs, []);
  });

  await t.test("mallory, in no mapped group, is refused with a clear page", async () => {
    const mallory = await person();
    await signIn(mallory, "mallory");
    await mallory.waitForLoadState();
    const text = await mallory.locator("main").textContent();
    assert.match(text, /403/);
    assert.match(text, /has no role in toolgate/);
    await mallory.screenshot({ path: path.join(shots, "sso-refused.png"), fullPage: true });
    await mallory.goto(`${base}/admin`);
    assert.match(mallory.url(), /\/admin\/login/, "mallory got no session");
  });

  await t.test("alice disables bob: his session stops at once, and he cannot sign in again", async () => {
    await alice.goto(`${base}/admin/accounts`);
    await alice.click('#accounts a:text-is("bob")');
    assert.match(await alice.locator("#account-role").textContent(), /auditor/);
    await alice.click('a:text("Disable")');
    await alice.click('button:text("Disable account")');
    await alice.waitForURL(`${base}/admin/accounts/bob`);
    assert.equal((await alice.locator("#account-state").textContent()).trim(), "disabled");

    await bob.goto(`${base}/admin/audit`);
    assert.match(bob.url(), /\/admin\/login/, "the disabled account's session still worked");
    // The provider still has bob signed in; toolgate refuses him anyway.
    await bob.click("#sso-sign-in");
    await bob.waitForURL((u) => u.href.startsWith(`${base}/admin/sso/callback`) || u.href.startsWith(issuer));
    if (bob.url().startsWith(issuer)) {
      await bob.waitForURL((u) => u.href.startsWith(`${base}/admin/sso/callback`));
    }
    await bob.waitForLoadState();
    assert.match(await bob.locator("main").textContent(), /This account is disabled/);
    await bob.goto(`${base}/admin`);
    assert.match(bob.url(), /\/admin\/login/);
  });

  await t.test("every SSO sign-in and refusal is in the audit log, with where it came from", async () => {
    // Sign-in events are written without holding up the answer: wait for the last one.
    let q;
    for (let i = 0; i < 50; i++) {
      q = spawnSync("psql", [databaseUrl, "-AtF", "|", "-c",
        "SELECT outcome, admin_user, coalesce(error, ''), remote_addr IS NOT NULL, user_agent IS NOT NULL"
        + " FROM audit_events WHERE event_type = 'admin.login' AND resource = 'admin-ui:sso' ORDER BY id"],
      { encoding: "utf8" });
      assert.equal(q.status, 0, q.stderr);
      if (q.stdout.includes("account disabled")) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const rows = q.stdout.trim().split("\n");
    const has = (re) => assert.ok(rows.some((r) => re.test(r)), `${re} not in\n${q.stdout}`);
    has(/^success\|admin:alice\|\|t\|t$/);
    has(/^success\|admin:bob\|\|t\|t$/);
    has(/^denied\|admin:mallory\|no mapped role\|t\|t$/);
    has(/^denied\|admin:bob\|account disabled\|t\|t$/);
    // alice's account was provisioned by the provider's word, keyed by issuer and subject.
    const acct = spawnSync("psql", [databaseUrl, "-At", "-c",
      "SELECT oidc_issuer || ' ' || oidc_subject || ' ' || role || ' ' || (password_hash IS NULL)"
      + " FROM admin_users WHERE username = 'alice'"], { encoding: "utf8" });
    assert.equal(acct.stdout.trim(), `${issuer} alice admin true`);
  });
});
