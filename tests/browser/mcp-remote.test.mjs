// The bridge desktop hosts run (`mcp-remote`, what Claude Desktop and Cursor start to reach a
// remote server) connects with nothing but the server's URL, end to end: it discovers the
// server, registers itself (RFC 7591), the registration waits for an admin, who approves it on
// the Host applications page in a real browser; alice signs in and consents in headless
// Chromium; mcp-remote exchanges the code and bridges stdio to the gateway, and a tool call
// through it is on record with alice, the agent and the registered client.
//
// mcp-remote is pinned in package.json and run from node_modules with the server URL as its
// only argument. Its own browser launch finds no display here, so the test reads the sign-in
// link it prints, as a person would copy it.
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

const database = `toolgate_mcp_remote_${process.pid}_${Date.now()}`;
const databaseUrl = `${pgBase}/${database}`;
const password = "a long password for the person signing in";
const adminToken = "mcp-remote-test-admin-token";
const here = path.dirname(new URL(import.meta.url).pathname);

function policiesDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-policies-"));
  fs.mkdirSync(path.join(dir, "agents", "assistant"), { recursive: true });
  fs.writeFileSync(path.join(dir, "agents", "assistant", "agent.md"),
    "---\ndescription: Answers from the team's notes.\ntools: [search]\nusers: [alice]\n---\n");
  return dir;
}

/// mcp-remote over its stdio: newline-delimited JSON-RPC, answers matched by id.
class Bridge {
  constructor(child) {
    this.child = child;
    this.pending = new Map();
    this.stderr = [];
    this.waiters = [];
    readline.createInterface({ input: child.stdout }).on("line", (line) => {
      let msg;
      try { msg = JSON.parse(line); } catch { return; }
      const p = this.pending.get(msg.id);
      if (p) { this.pending.delete(msg.id); p(msg); }
    });
    readline.createInterface({ input: child.stderr }).on("line", (line) => {
      this.stderr.push(line);
      for (const w of [...this.waiters]) {
        if (w.test(line)) { this.waiters.splice(this.waiters.indexOf(w), 1); w.resolve(line); }
      }
    });
    this.nextId = 1;
  }
  /// Resolves with the first stderr line (already seen or to come) matching `re`.
  line(re) {
    const seen = this.stderr.find((l) => re.test(l));
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve) => this.waiters.push({ test: (l) => re.test(l), resolve }));
  }
  request(method, params) {
    const id = this.nextId++;
    const answer = new Promise((r) => this.pending.set(id, r));
    this.child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
    return answer;
  }
  notify(method, params) {
    this.child.stdin.write(JSON.stringify({ jsonrpc: "2.0", method, params }) + "\n");
  }
}

async function signIn(page, username) {
  await page.getByLabel("Username").fill(username);
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Sign in" }).click();
}

test("mcp-remote connects with only the URL: registers, an admin approves, alice signs in, a call goes through", { timeout: 240_000 }, async (t) => {
  fs.mkdirSync(shots, { recursive: true });
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const log = path.join(shots, "mcp-remote-server.log");
  const policies = policiesDir();
  const server = spawn(
    bin,
    ["serve", "--database-url", databaseUrl, "--bind", `127.0.0.1:${port}`,
      "--tools-dir", path.join(root, "tools"), "--policies-dir", policies, "--admin-token", adminToken],
    { env: cleanEnv(), stdio: ["ignore", fs.openSync(log, "w"), fs.openSync(log, "a")] },
  );
  const configDir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-mcp-auth-"));
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-chromium-"));
  let bridge;
  let browser;
  t.after(async () => {
    if (browser) await browser.close().catch(() => {});
    if (bridge) bridge.child.kill("SIGTERM");
    server.kill("SIGTERM");
    await new Promise((r) => (server.exitCode !== null ? r() : server.once("exit", r)));
    spawnSync("psql", [`${pgBase}/postgres`, "-qc", `DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`]);
    for (const d of [policies, configDir, profile]) fs.rmSync(d, { recursive: true, force: true });
  });
  await waitReady(base, server, log);
  const run = (args, input) => spawnSync(bin, args, { input, env: cleanEnv(), encoding: "utf8" });
  for (const [user, role] of [["alice", "viewer"], ["ops", "admin"]]) {
    const r = run(["admin", "create-user", "--database-url", databaseUrl, "--username", user, "--role", role], `${password}\n`);
    assert.equal(r.status, 0, r.stderr);
  }

  // Nothing but the URL. No display: its own browser launch fails and it prints the link.
  const env = { ...cleanEnv(), MCP_REMOTE_CONFIG_DIR: configDir, DISPLAY: "", WAYLAND_DISPLAY: "", BROWSER: "" };
  const child = spawn(process.execPath, [path.join(here, "node_modules/mcp-remote/dist/proxy.js"), `${base}/mcp`],
    { env, stdio: ["pipe", "pipe", "pipe"] });
  bridge = new Bridge(child);
  const bridgeLog = fs.createWriteStream(path.join(shots, "mcp-remote-bridge.log"));
  child.stderr.on("data", (d) => bridgeLog.write(d));
  const initialized = bridge.request("initialize", {
    protocolVersion: "2025-06-18",
    capabilities: {},
    clientInfo: { name: "desktop-host-stand-in", version: "1.0.0" },
  });

  let authorizeUrl;
  await t.test("it discovers the server and registers itself; the registration is held", async () => {
    await bridge.line(/Please authorize this client by visiting/);
    authorizeUrl = new URL(await bridge.line(/^https?:\/\/\S+\/oauth\/authorize\?/));
    assert.equal(authorizeUrl.origin, base);
    const clientId = authorizeUrl.searchParams.get("client_id");
    assert.match(clientId, /^dyn-/);
    // The OpenID scopes it asks for by habit are not what stops it.
    const res = await fetch(`${base}/api/v1/public-clients`, { headers: { authorization: `Bearer ${adminToken}` } });
    const { public_clients } = await res.json();
    assert.equal(public_clients.length, 1);
    assert.equal(public_clients[0].client_id, clientId);
    assert.equal(public_clients[0].status, "held");
    assert.equal(public_clients[0].registration, "dynamic");
  });

  browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: chromiumArgs });
  const aliceContext = await browser.newContext({ viewport: { width: 1100, height: 900 } });
  const alice = await aliceContext.newPage();
  const problems = [];
  alice.on("pageerror", (e) => problems.push(String(e)));

  await t.test("alice following the link is told it waits for an admin, and nothing is redirected", async () => {
    const res = await alice.goto(authorizeUrl.href);
    assert.equal(res.status(), 400);
    assert.equal(new URL(alice.url()).origin, base);
    assert.match(await alice.locator("#authorize-error").textContent(), /waits for an administrator's approval/);
    await alice.screenshot({ path: path.join(shots, "30-registration-held.png"), fullPage: true });
  });

  await t.test("an admin approves it on the Host applications page", async () => {
    const adminContext = await browser.newContext({ viewport: { width: 1100, height: 900 } });
    const ops = await adminContext.newPage();
    ops.on("pageerror", (e) => problems.push(String(e)));
    await ops.goto(`${base}/admin/hosts`);
    await signIn(ops, "ops");
    await ops.waitForURL(`${base}/admin/hosts`);
    const clientId = authorizeUrl.searchParams.get("client_id");
    const row = ops.locator(`tr[data-client-id="${clientId}"]`);
    assert.equal(await row.getAttribute("data-status"), "held");
    assert.match(await row.textContent(), /MCP CLI/);
    await ops.screenshot({ path: path.join(shots, "31-hosts-held.png"), fullPage: true });
    await row.getByRole("button", { name: "Approve" }).click();
    await ops.waitForURL(`${base}/admin/hosts`);
    assert.equal(await ops.locator(`tr[data-client-id="${clientId}"]`).getAttribute("data-status"), "active");
    await adminContext.close();
  });

  await t.test("alice reloads, signs in, consents, and mcp-remote gets its tokens", async () => {
    await alice.goto(authorizeUrl.href);
    assert.match(alice.url(), /\/admin\/login\?next=%2Fadmin%2Fconsent%3F/, await alice.locator("body").textContent());
    await signIn(alice, "alice");
    await alice.waitForURL(/\/admin\/consent\?/);
    await alice.screenshot({ path: path.join(shots, "32-mcp-remote-consent.png"), fullPage: true });
    await alice.getByRole("button", { name: "Allow" }).click();
    // The redirect lands on mcp-remote's own loopback listener.
    await alice.waitForURL(/^http:\/\/(localhost|127\.0\.0\.1):\d+\/oauth\/callback\?/);
    assert.match(await alice.locator("body").textContent(), /Authorization successful/i);
  });

  await t.test("through the bridge: initialize, the assistant's tools, a call", async () => {
    const init = await initialized;
    assert.ok(init.result, JSON.stringify(init));
    assert.equal(init.result.serverInfo.name, "toolgate");
    bridge.notify("notifications/initialized", {});
    const listed = await bridge.request("tools/list", {});
    assert.deepEqual(listed.result.tools.map((x) => x.name).sort(), ["search__get", "search__query"]);
    const called = await bridge.request("tools/call", { name: "search__query", arguments: { q: "deploy rollback" } });
    assert.ok(called.result, JSON.stringify(called));
    assert.notEqual(called.result.isError, true, JSON.stringify(called.result));
  });

  await t.test("the call is on record with alice, the assistant and the registered client", async () => {
    const clientId = authorizeUrl.searchParams.get("client_id");
    let call;
    for (let i = 0; i < 100 && !call; i++) {
      const res = await fetch(`${base}/api/v1/audit?agent=assistant`, { headers: { authorization: `Bearer ${adminToken}` } });
      assert.equal(res.status, 200);
      call = (await res.json()).events.find((e) => e.event_type === "tool.result" && e.tool === "search__query" && e.outcome === "success");
      if (!call) await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(call, "a tool.result row");
    assert.equal(call.person, "alice");
    assert.equal(call.client_id, clientId);
  });

  assert.deepEqual(problems, []);
});
