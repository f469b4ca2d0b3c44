// Approvals in a real browser (the system's headless Chromium): an agent's call waits for a
// person; an approver signed in in another browser session reads the exact call in the inbox and
// approves it; the call runs once and its result reaches the agent at its status URL. A person
// who may act as the agent cannot approve the agent's call. A 2025-era MCP call made with the
// official TypeScript SDK is held open, with progress notifications, while the approver approves
// it in the browser; its result arrives in the same callTool.
//
// Environment: as admin-ui.test.mjs (TOOLGATE_BIN, PG_BASE, CHROMIUM, SCREENSHOT_DIR).

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { bin, chromiumArgs, chromiumPath, cleanEnv, freePort, pgBase, root, shots, waitReady } from "./common.mjs";

const database = `toolgate_approvals_${process.pid}_${Date.now()}`;
const databaseUrl = `${pgBase}/${database}`;
const adminToken = "approvals-browser-admin-token";
const password = "a long password for the approver";

function policiesDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-policies-"));
  fs.mkdirSync(path.join(dir, "agents", "planner"), { recursive: true });
  fs.writeFileSync(
    path.join(dir, "agents", "planner", "agent.md"),
    "---\ndescription: Plans trips.\ntools: [weather]\n" +
      "approval:\n  weather__forecast: {when: {days: {exclusiveMinimum: 3}}, approvers: [finance], ttl: 10m}\n---\n",
  );
  return dir;
}

test("an approver approves an agent's call in the browser and it runs once", { timeout: 180_000 }, async (t) => {
  fs.mkdirSync(shots, { recursive: true });
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const log = path.join(shots, "server-approvals.log");
  const policies = policiesDir();
  const server = spawn(
    bin,
    ["serve", "--database-url", databaseUrl, "--bind", `127.0.0.1:${port}`, "--policies-dir", policies,
      "--tools-dir", path.join(root, "tools"), "--admin-token", adminToken,
      // Long enough for the approver to sign in and approve while the MCP call is held.
      "--approval-hold-secs", "45"],
    { env: cleanEnv(), stdio: ["ignore", fs.openSync(log, "w"), fs.openSync(log, "a")] },
  );
  const contexts = [];
  t.after(async () => {
    for (const c of contexts) await c.close().catch(() => {});
    server.kill("SIGTERM");
    await new Promise((r) => (server.exitCode !== null ? r() : server.once("exit", r)));
    spawnSync("psql", [`${pgBase}/postgres`, "-qc", `DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`]);
    fs.rmSync(policies, { recursive: true, force: true });
  });
  await waitReady(base, server, log);

  const admin = { authorization: `Bearer ${adminToken}`, "content-type": "application/json" };
  const api = async (method, p, body) => {
    const r = await fetch(base + p, { method, headers: admin, body: body && JSON.stringify(body) });
    const text = await r.text();
    assert.ok(r.ok, `${method} ${p} -> ${r.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
  // fiona approves for finance; alice is in finance too, but may act as the agent herself.
  for (const [user, role] of [["fiona", "viewer"], ["alice", "member"]]) {
    const created = spawnSync(
      bin,
      ["admin", "create-user", "--database-url", databaseUrl, "--username", user, "--role", role],
      { input: `${password}\n`, env: cleanEnv(), encoding: "utf8" },
    );
    assert.equal(created.status, 0, created.stderr);
    await api("PUT", `/api/v1/users/${user}/approver-sets`, { sets: ["finance"] });
  }
  await api("PUT", "/api/v1/agents/planner/users/alice");
  const cred = await api("POST", "/api/v1/agents/planner/clients", {});
  const tokenReply = await fetch(`${base}/oauth/token`, {
    method: "POST",
    headers: {
      authorization: "Basic " + Buffer.from(`${cred.client_id}:${cred.client_secret}`).toString("base64"),
      "content-type": "application/x-www-form-urlencoded",
    },
    body: new URLSearchParams({ grant_type: "client_credentials", resource: `${base}/mcp` }),
  });
  const agentToken = (await tokenReply.json()).access_token;
  const asAgent = (p) => fetch(base + p, { headers: { authorization: `Bearer ${agentToken}` } });

  const session = async () => {
    const profile = fs.mkdtempSync(path.join(os.tmpdir(), "toolgate-chromium-"));
    t.after(() => fs.rmSync(profile, { recursive: true, force: true }));
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: chromiumPath, headless: true, viewport: { width: 1360, height: 900 }, args: chromiumArgs,
    });
    contexts.push(context);
    return context.pages()[0] || (await context.newPage());
  };
  const signIn = async (page, user) => {
    await page.goto(`${base}/admin/login`);
    await page.getByLabel("Username").fill(user);
    await page.getByLabel("Password").fill(password);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.waitForLoadState();
  };

  let approval;
  await t.test("the agent's call above the threshold waits: 202 and a status URL", async () => {
    const small = await asAgent("/tools/weather/forecast?city=Paris&days=2");
    assert.equal(small.status, 200);
    const r = await asAgent("/tools/weather/forecast?city=Paris&days=5");
    assert.equal(r.status, 202);
    approval = await r.json();
    assert.equal(approval.status, "pending");
    assert.equal((await asAgent(approval.status_url)).status, 202);
  });

  await t.test("a person who may act as the agent cannot approve its call", async () => {
    const page = await session();
    await signIn(page, "alice");
    await page.goto(`${base}/admin/approvals`);
    const card = page.locator(`[data-approval="${approval.approval}"]`);
    await card.getByRole("button", { name: "Approve this call" }).click();
    await page.waitForLoadState();
    assert.match(await page.locator("body").textContent(), /own identity/);
    assert.equal((await asAgent(approval.status_url)).status, 202);
  });

  await t.test("the approver reads the exact call in the inbox and approves it", async () => {
    const page = await session();
    await signIn(page, "fiona");
    await page.goto(`${base}/admin/approvals`);
    const card = page.locator(`[data-approval="${approval.approval}"]`);
    assert.match(await card.getByLabel("Arguments of this call").textContent(), /"days": 5/);
    // No call of this tool was approved before: its whole definition is there to read.
    assert.match(await card.locator(".definition-note").textContent(), /No call of this tool was approved before/);
    assert.match(await card.textContent(), /planner/);
    await page.screenshot({ path: path.join(shots, "30-approvals-inbox.png"), fullPage: true });
    await card.getByLabel(/Reason/).fill("trip approved by finance");
    await card.getByRole("button", { name: "Approve this call" }).click();
    await page.waitForURL(`${base}/admin/approvals`);
    assert.match(await page.locator("[role=status].flash").textContent(), /runs once now/);
    await page.screenshot({ path: path.join(shots, "31-approvals-decided.png"), fullPage: true });
  });

  await t.test("the call ran once and its result is at the status URL", async () => {
    let r;
    for (let i = 0; i < 100; i++) {
      r = await asAgent(approval.status_url);
      if (r.status === 200) break;
      await new Promise((ok) => setTimeout(ok, 100));
    }
    assert.equal(r.status, 200);
    const body = await r.json();
    assert.equal(body.days, 5);
    assert.equal(body.forecast.length, 5);
    const shown = await api("GET", `/api/v1/approvals/${approval.approval}`);
    assert.equal(shown.approval.state, "done");
    assert.equal(shown.approval.decided_by, "fiona");
    assert.equal(shown.approval.reason, "trip approved by finance");
  });

  await t.test("a 2025-era MCP call (TypeScript SDK) is held with progress until approved in the browser", async () => {
    const client = new Client({ name: "toolgate-approvals-test", version: "1.0.0" });
    const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
      requestInit: { headers: { authorization: `Bearer ${agentToken}` } },
    });
    await client.connect(transport);
    t.after(() => client.close().catch(() => {}));
    const progress = [];
    let told;
    const firstProgress = new Promise((ok) => (told = ok));
    const call = client.callTool({ name: "weather__forecast", arguments: { city: "Madrid", days: 6 } }, undefined, {
      onprogress: (p) => {
        progress.push(p.message || "");
        told();
      },
      resetTimeoutOnProgress: true,
      timeout: 60_000,
    });
    let settled = false;
    call.finally(() => (settled = true)).catch(() => {});
    await firstProgress;
    const pending = (await api("GET", "/api/v1/approvals?state=pending")).approvals.find(
      (a) => a.tool === "weather__forecast" && JSON.parse(a.shown_arguments).city === "Madrid",
    );
    assert.ok(pending, "the held call's request is in the inbox");
    assert.match(progress[0], new RegExp(`waiting for approval ${pending.id}`));
    assert.equal(settled, false, "callTool returned before anyone decided");

    const page = await session();
    await signIn(page, "fiona");
    await page.goto(`${base}/admin/approvals`);
    const card = page.locator(`[data-approval="${pending.id}"]`);
    assert.match(await card.getByLabel("Arguments of this call").textContent(), /"city": "Madrid"/);
    assert.match(await card.locator(".definition-note").textContent(), /The same definition as when a call of this tool was last approved/);
    await card.getByLabel(/Reason/).fill("Madrid is fine");
    await card.getByRole("button", { name: "Approve this call" }).click();
    await page.waitForURL(`${base}/admin/approvals`);

    const result = await call;
    assert.equal(result.isError, false, JSON.stringify(result));
    assert.equal(result.structuredContent.days, 6);
    assert.equal(result.structuredContent.forecast.length, 6);
    const shown = await api("GET", `/api/v1/approvals/${pending.id}`);
    assert.equal(shown.approval.state, "done");
    assert.equal(shown.approval.decided_by, "fiona");
  });
});
