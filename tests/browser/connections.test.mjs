// A person connects to an upstream's own sign-in from "My connections", in a real browser:
// the system's headless Chromium (playwright-core), panva's oidc-provider as the upstream's
// authorization server (tests/oidc-provider/op.mjs, its own login and consent pages), and the
// echo upstream (tests/fixtures/echo-upstream/server.mjs, official MCP SDK) that checks each
// token at the provider and publishes the protected-resource metadata toolgate discovers it by.
//
// What only a browser shows: the way back from the provider is a cross-site redirect chain, so
// toolgate's SameSite=Strict session cookie does not come with the callback. The connection
// must still land in the right person's slot and the person must end on their page, signed in.
//
// Environment: TOOLGATE_BIN, PG_BASE, CHROMIUM, SCREENSHOT_DIR (see common.mjs).

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { chromium } from "playwright-core";
import { bin, chromiumArgs, chromiumPath, cleanEnv, freePort, pgBase, root, shots, waitReady } from "./common.mjs";

const database = `toolgate_connect_${process.pid}_${Date.now()}`;
const databaseUrl = `${pgBase}/${database}`;
const adminToken = "connections-browser-test-admin-token";
const password = "a long password for alice in the browser test";
const lister = "tok-lister-000000000001";

test("a person connects to an upstream's sign-in and lands back on their page", { timeout: 180_000 }, async (t) => {
  fs.mkdirSync(shots, { recursive: true });
  const [port, opPort, echoPort] = [await freePort(), await freePort(), await freePort()];
  const base = `http://127.0.0.1:${port}`;
  const issuer = `http://127.0.0.1:${opPort}`;

  // The upstream's authorization server, with toolgate registered as a public client.
  const op = spawn(
    process.execPath,
    [path.join(root, "tests/oidc-provider/op.mjs"), "--port", String(opPort),
      "--redirect-uri", `${base}/admin/connections/callback`, "--public-client", "toolgate-upstream"],
    { stdio: ["ignore", "pipe", fs.openSync(path.join(shots, "connect-op.log"), "w")] },
  );
  t.after(() => op.kill("SIGTERM"));
  const opReady = await new Promise((resolve, reject) => {
    op.once("exit", (code) => reject(new Error(`op.mjs exited (${code})`)));
    readline.createInterface({ input: op.stdout }).once("line", (line) => resolve(JSON.parse(line)));
  });
  assert.equal(opReady.issuer, issuer);

  // The echo upstream, beside this folder's node_modules (it imports the SDK, express, zod).
  const echoDir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-echo-"));
  fs.symlinkSync(path.join(root, "tests/browser/node_modules"), path.join(echoDir, "node_modules"));
  fs.copyFileSync(path.join(root, "tests/fixtures/echo-upstream/server.mjs"), path.join(echoDir, "server.mjs"));
  const echo = spawn(process.execPath, [path.join(echoDir, "server.mjs"), "http", String(echoPort)], {
    env: { ...process.env, TOKENS: JSON.stringify({ [lister]: "lister" }), USERINFO_URL: `${issuer}/me`, AS_ISSUER: issuer },
    stdio: ["ignore", "ignore", fs.openSync(path.join(shots, "connect-echo.log"), "w")],
  });
  t.after(() => {
    echo.kill("SIGTERM");
    fs.rmSync(echoDir, { recursive: true, force: true });
  });

  const key = spawnSync(bin, ["secrets", "keygen", "--id", "k1"], { env: cleanEnv(), encoding: "utf8" });
  assert.equal(key.status, 0, key.stderr);
  const log = path.join(shots, "connect-server.log");
  const server = spawn(
    bin,
    ["serve", "--database-url", databaseUrl, "--bind", `127.0.0.1:${port}`,
      "--tools-dir", path.join(root, "tools"), "--policies-dir", path.join(root, "policies"),
      "--admin-token", adminToken],
    {
      // The key-encryption key from the environment, as a secret manager would give it.
      env: { ...cleanEnv(), TOOLGATE_CREDENTIAL_KEYS: key.stdout.trim() },
      stdio: ["ignore", fs.openSync(log, "w"), fs.openSync(log, "a")],
    },
  );
  t.after(async () => {
    server.kill("SIGTERM");
    await new Promise((r) => (server.exitCode !== null ? r() : server.once("exit", r)));
    spawnSync("psql", [`${pgBase}/postgres`, "-qc", `DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`]);
  });
  await waitReady(base, server, log);

  const created = spawnSync(
    bin,
    ["admin", "create-user", "--database-url", databaseUrl, "--username", "alice", "--role", "viewer"],
    { input: `${password}\n`, env: cleanEnv(), encoding: "utf8" },
  );
  assert.equal(created.status, 0, created.stderr);
  const api = async (method, p, body) => {
    const r = await fetch(`${base}${p}`, {
      method,
      headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
      body: body && JSON.stringify(body),
    });
    assert.ok(r.ok, `${method} ${p}: ${r.status} ${await r.text()}`);
  };
  await api("PUT", "/api/v1/agents/assistant/users/alice");
  await api("PUT", "/api/v1/upstreams/linked", {
    transport: "http",
    url: `http://127.0.0.1:${echoPort}/mcp`,
    headers: { Authorization: `Bearer ${lister}` },
    credentials: { LINK: { per: "person", inject: 'header Authorization "Bearer {}"', oauth: { client_id: "toolgate-upstream", scopes: ["openid"] } } },
    pin: false,
  });
  await api("POST", "/api/v1/agents/assistant/grants", { target: "linked" });

  const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: chromiumArgs });
  t.after(() => browser.close());
  const page = await (await browser.newContext()).newPage();
  const problems = [];
  page.on("pageerror", (e) => problems.push(String(e)));

  await page.goto(`${base}/admin/login`);
  await page.getByLabel("Username").fill("alice");
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.waitForURL((u) => !u.pathname.startsWith("/admin/login"));

  // The slot appears once the upstream's tools are listed (the page names only groups alice's
  // agents reach); the upstream starts in the background.
  const connect = page.locator('[data-connect="linked/LINK"]');
  for (let i = 0; i < 120 && (await connect.count()) === 0; i++) {
    await page.goto(`${base}/admin/connections`);
    if ((await connect.count()) === 0) await page.waitForTimeout(500);
  }
  assert.equal(await connect.count(), 1, await page.content());
  assert.match(await page.locator('[data-slot="linked/LINK"]').textContent(), /not connected/);
  await page.screenshot({ path: path.join(shots, "connect-01-before.png"), fullPage: true });

  // Connect: to the provider's login and consent pages, and back.
  await connect.click();
  await page.waitForURL((u) => u.href.startsWith(issuer));
  await page.fill('input[name="login"]', "alice");
  await page.fill('input[name="password"]', "any password works at this provider");
  await page.click('button[type="submit"]');
  await page.waitForURL((u) => !u.href.startsWith(issuer) || /interaction/.test(u.href));
  if (page.url().startsWith(issuer)) await page.click('button[type="submit"]');

  // Back at toolgate, and on to alice's own page, still signed in (not the sign-in page).
  await page.waitForURL(`${base}/admin/connections`);
  const row = page.locator('[data-slot="linked/LINK"]');
  assert.match(await row.textContent(), /connected/);
  assert.doesNotMatch(await row.textContent(), /not connected/);
  assert.equal(await page.locator('[data-connect="linked/LINK"]').textContent(), "Reconnect");
  await page.screenshot({ path: path.join(shots, "connect-02-connected.png"), fullPage: true });

  // Stored for alice, sealed, due for refresh; on record by name.
  const q = (sql) => spawnSync("psql", [databaseUrl, "-tAc", sql], { encoding: "utf8" }).stdout.trim();
  assert.equal(q("SELECT owner || '/' || group_name || '/' || name || ':' || (refresh_at IS NOT NULL) FROM credentials"), "alice/linked/LINK:true");
  assert.equal(q("SELECT count(*) FROM audit_events WHERE details::jsonb->>'action' = 'credential.connected'"), "1");
  assert.deepEqual(problems, []);
});
