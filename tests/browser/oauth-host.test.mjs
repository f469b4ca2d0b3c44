// An interactive MCP host signs a person in, end to end, with clients nobody here wrote: the
// official TypeScript MCP SDK's OAuth client provider (`@modelcontextprotocol/sdk`,
// client/auth.js) over `StreamableHTTPClientTransport`, and the system's headless Chromium
// (driven by playwright-core) for the sign-in and consent pages.
//
// Starts the real `toolgate serve` over a fresh database; `alice` (a viewer) may act as the
// agent `assistant`; the host is a public client registered with `toolgate client
// register-public` (the SDK accepts only https metadata-document URLs, which a local test
// cannot serve with a trusted certificate). The SDK discovers the server, starts the
// authorization (PKCE S256, state, resource), the browser signs alice in and consents, the
// redirect reaches the host's loopback listener on a port of its own, the SDK exchanges the
// code and lists exactly the assistant's tools; the audit rows name alice, the agent and the
// host. Revoking the authorization on alice's page ends the host's token.
//
// Environment: TOOLGATE_BIN (default target/debug/toolgate), PG_BASE (default
// postgres://root@127.0.0.1:5432), CHROMIUM (default /usr/bin/chromium), SCREENSHOT_DIR.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";
import { bin, chromiumArgs, chromiumPath, cleanEnv, freePort, pgBase, root, shots, waitReady } from "./common.mjs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const database = `toolgate_oauth_host_${process.pid}_${Date.now()}`;
const databaseUrl = `${pgBase}/${database}`;
const password = "a long password for the person signing in";
const adminToken = "oauth-host-test-admin-token";

function policiesDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-policies-"));
  const agent = (name, body) => {
    fs.mkdirSync(path.join(dir, "agents", name), { recursive: true });
    fs.writeFileSync(path.join(dir, "agents", name, "agent.md"), body);
  };
  agent("assistant", "---\ndescription: Answers from the team's notes.\ntools: [search]\nusers: [alice]\n---\n");
  agent("meteo", "---\ndescription: Weather.\ntools: [weather]\n---\n");
  return dir;
}

/// The host's loopback listener: resolves with the query of the first /callback request.
function callbackListener(port) {
  let deliver;
  const received = new Promise((r) => (deliver = r));
  const server = http.createServer((req, res) => {
    const u = new URL(req.url, `http://127.0.0.1:${port}`);
    if (u.pathname !== "/callback") {
      // The browser asks the host's page for its icon too.
      res.writeHead(204).end();
      return;
    }
    res.writeHead(200, { "content-type": "text/plain" }).end("You can close this window.");
    deliver(Object.fromEntries(u.searchParams));
  });
  return new Promise((resolve) => server.listen(port, "127.0.0.1", () => resolve({ server, received })));
}

/// An in-memory OAuthClientProvider, as a host keeps one per server.
class HostProvider {
  constructor(redirectUrl, clientId) {
    this._redirectUrl = redirectUrl;
    this._client = { client_id: clientId };
    this._tokens = undefined;
    this._verifier = undefined;
    this.authorizationUrl = undefined;
    this.lastState = undefined;
  }
  get redirectUrl() { return this._redirectUrl; }
  get clientMetadata() {
    return {
      client_name: "SDK test host",
      redirect_uris: [this._redirectUrl],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
  }
  state() { this.lastState = `st-${Math.random().toString(36).slice(2)}`; return this.lastState; }
  clientInformation() { return this._client; }
  tokens() { return this._tokens; }
  saveTokens(t) { this._tokens = t; }
  redirectToAuthorization(url) { this.authorizationUrl = url; }
  saveCodeVerifier(v) { this._verifier = v; }
  codeVerifier() { return this._verifier; }
}

test("a host signs alice in as the assistant through the official SDK and a real browser", { timeout: 180_000 }, async (t) => {
  fs.mkdirSync(shots, { recursive: true });
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const log = path.join(shots, "oauth-host-server.log");
  const policies = policiesDir();
  const server = spawn(
    bin,
    ["serve", "--database-url", databaseUrl, "--bind", `127.0.0.1:${port}`,
      "--tools-dir", path.join(root, "tools"), "--policies-dir", policies, "--admin-token", adminToken],
    { env: cleanEnv(), stdio: ["ignore", fs.openSync(log, "w"), fs.openSync(log, "a")] },
  );
  const cbPort = await freePort();
  const { server: cbServer, received } = await callbackListener(cbPort);
  let context;
  t.after(async () => {
    if (context) await context.close().catch(() => {});
    cbServer.close();
    server.kill("SIGTERM");
    await new Promise((r) => (server.exitCode !== null ? r() : server.once("exit", r)));
    spawnSync("psql", [`${pgBase}/postgres`, "-qc", `DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`]);
    fs.rmSync(policies, { recursive: true, force: true });
  });
  await waitReady(base, server, log);

  const run = (args, input) => spawnSync(bin, args, { input, env: cleanEnv(), encoding: "utf8" });
  let r = run(["admin", "create-user", "--database-url", databaseUrl, "--username", "alice", "--role", "viewer"], `${password}\n`);
  assert.equal(r.status, 0, r.stderr);
  // Registered without a port: the host listens on whichever it got (RFC 8252 §7.3).
  r = run(["client", "register-public", "--database-url", databaseUrl, "--client-id", "sdk-test-host",
    "--name", "SDK test host", "--redirect-uri", "http://127.0.0.1/callback"]);
  assert.equal(r.status, 0, r.stderr);

  const redirectUrl = `http://127.0.0.1:${cbPort}/callback`;
  const provider = new HostProvider(redirectUrl, "sdk-test-host");
  const mcpUrl = new URL(`${base}/mcp`);

  await t.test("the SDK discovers the server and starts the authorization", async () => {
    const client = new Client({ name: "sdk-test-host", version: "1.0.0" });
    await assert.rejects(
      client.connect(new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider })),
      (e) => e instanceof UnauthorizedError,
    );
    const u = provider.authorizationUrl;
    assert.ok(u, "the SDK asked to open the authorization URL");
    assert.equal(u.origin + u.pathname, `${base}/oauth/authorize`);
    assert.equal(u.searchParams.get("code_challenge_method"), "S256");
    assert.equal(u.searchParams.get("client_id"), "sdk-test-host");
    assert.equal(u.searchParams.get("state"), provider.lastState);
    assert.equal(u.searchParams.get("resource"), `${base}/mcp`);
  });

  const profile = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-chromium-"));
  t.after(() => fs.rmSync(profile, { recursive: true, force: true }));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1100, height: 900 },
    args: chromiumArgs,
  });
  const page = context.pages()[0] || (await context.newPage());
  const problems = [];
  page.on("console", (m) => { if (m.type() === "error") problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(String(e)));

  let callback;
  await t.test("alice signs in, sees the host and her agent, and allows", async () => {
    await page.goto(provider.authorizationUrl.href);
    assert.match(page.url(), /\/admin\/login\?next=%2Fadmin%2Fconsent%3F/);
    await page.getByLabel("Username").fill("alice");
    await page.getByLabel("Password").fill(password);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.waitForURL(/\/admin\/consent\?/);
    assert.equal(await page.locator("#consent-client-name").textContent(), "SDK test host");
    // Only the agents alice may act as are offered.
    const offered = await page.locator('input[name="agent"]').evaluateAll((els) => els.map((e) => e.value));
    assert.deepEqual(offered, ["assistant"]);
    await page.screenshot({ path: path.join(shots, "20-consent.png"), fullPage: true });
    await page.getByRole("button", { name: "Allow" }).click();
    callback = await received;
    assert.equal(callback.state, provider.lastState);
    assert.equal(callback.iss, base);
    assert.ok(callback.code);
  });

  let tokens;
  await t.test("the SDK exchanges the code and sees exactly the assistant's tools", async () => {
    const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider });
    await transport.finishAuth(callback.code);
    tokens = provider.tokens();
    assert.ok(tokens.access_token && tokens.refresh_token);
    const claims = JSON.parse(Buffer.from(tokens.access_token.split(".")[1], "base64url"));
    assert.equal(claims.sub, "assistant");
    assert.deepEqual(claims.act, { sub: "alice" });
    const client = new Client({ name: "sdk-test-host", version: "1.0.0" });
    await client.connect(new StreamableHTTPClientTransport(mcpUrl, { authProvider: provider }));
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((x) => x.name).sort(), ["search__get", "search__query"]);
    await client.close();
  });

  await t.test("the audit rows name alice, the assistant and the host", async () => {
    // tools/list rows are written without the caller waiting: look until it is there.
    let rows = [];
    for (let i = 0; i < 100 && !rows.some((e) => e.event_type === "tools/list"); i++) {
      const res = await fetch(`${base}/api/v1/audit?agent=assistant`, { headers: { authorization: `Bearer ${adminToken}` } });
      assert.equal(res.status, 200);
      rows = (await res.json()).events;
      if (!rows.some((e) => e.event_type === "tools/list")) await new Promise((r) => setTimeout(r, 100));
    }
    const mine = rows.filter((e) => ["tools/list", "token.issued", "initialize"].includes(e.event_type) && e.outcome === "success");
    assert.ok(mine.some((e) => e.event_type === "tools/list"), JSON.stringify(rows));
    assert.ok(mine.some((e) => e.event_type === "token.issued"), JSON.stringify(rows));
    for (const e of mine) {
      assert.equal(e.person, "alice", JSON.stringify(e));
      assert.equal(e.agent, "assistant", JSON.stringify(e));
      assert.equal(e.client_id, "sdk-test-host", JSON.stringify(e));
    }
  });

  await t.test("alice revokes the host on her page and its token stops working", async () => {
    await page.goto(`${base}/admin/authorizations`);
    await page.screenshot({ path: path.join(shots, "21-authorizations.png"), fullPage: true });
    await page.getByRole("button", { name: "Revoke" }).click();
    await page.waitForURL(`${base}/admin/authorizations`);
    assert.match(await page.locator(".flash").textContent(), /revoked/);
    const res = await fetch(`${base}/mcp`, {
      method: "POST",
      headers: { authorization: `Bearer ${tokens.access_token}`, "content-type": "application/json",
        accept: "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/list", params: {} }),
    });
    assert.equal(res.status, 401);
  });

  assert.deepEqual(problems, []);
});
