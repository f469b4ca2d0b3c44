// Replaying an admin sign-in against the real OpenID Provider (op.mjs): a callback presented a
// second time, a callback carried into another browser's sign-in, and an ID token whose nonce
// is not the one this sign-in asked for (a made-up one, or one from an earlier sign-in) are
// all refused, with no session, each for its own reason in the audit log.
//
// No browser: the provider's development login and consent pages are plain forms, driven
// with fetch. Starts op.mjs and `toolgate serve --oidc-*` on free ports over a fresh
// database. Run: `node --test tests/oidc-provider/replay.test.mjs` (after `npm ci` here).
//
// Environment: TOOLGATE_BIN (default target/debug/toolgate), PG_BASE (default
// postgres://root@127.0.0.1:5432).

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "../..");
const bin = process.env.TOOLGATE_BIN || path.join(root, "target/debug/toolgate");
const pgBase = process.env.PG_BASE || "postgres://root@127.0.0.1:5432";
const database = `toolgate_sso_replay_${process.pid}_${Date.now()}`;
const clientSecret = "toolgate-test-secret";

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

function cleanEnv() {
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith("TOOLGATE_")) delete env[k];
  return env;
}

/// `name=value` pairs of a response's Set-Cookie headers.
function setCookies(r) {
  const out = {};
  for (const c of r.headers.getSetCookie()) {
    const [pair, ...attrs] = c.split(";");
    const at = pair.indexOf("=");
    const expired = attrs.some((a) => /max-age=0\b/i.test(a.trim()));
    out[pair.slice(0, at).trim()] = expired ? null : pair.slice(at + 1).trim();
  }
  return out;
}

/// A browser's cookies for one site, enough for the provider's pages.
class Jar {
  cookies = {};
  take(r) {
    for (const [k, v] of Object.entries(setCookies(r))) {
      if (v === null) delete this.cookies[k];
      else this.cookies[k] = v;
    }
  }
  header() {
    return Object.entries(this.cookies).map(([k, v]) => `${k}=${v}`).join("; ");
  }
}

/// Signs `login` in at the provider from `authUrl` through its login and consent pages; the
/// redirect back to toolgate's callback (which is not followed).
async function providerSignIn(authUrl, login, callbackPrefix) {
  const jar = new Jar();
  let url = authUrl;
  let form = null;
  for (let hop = 0; hop < 20; hop++) {
    const r = form
      ? await fetch(url, {
        method: "POST",
        redirect: "manual",
        headers: { cookie: jar.header(), "content-type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams(form).toString(),
      })
      : await fetch(url, { redirect: "manual", headers: { cookie: jar.header() } });
    jar.take(r);
    form = null;
    if (r.status >= 300 && r.status < 400) {
      url = new URL(r.headers.get("location"), url).href;
      if (url.startsWith(callbackPrefix)) return url;
      continue;
    }
    const html = await r.text();
    assert.equal(r.status, 200, `the provider answered ${r.status}: ${html}`);
    const action = html.match(/<form[^>]*action="([^"]+)"/);
    const prompt = html.match(/name="prompt" value="([^"]+)"/);
    assert.ok(action && prompt, `no form on the provider's page: ${html}`);
    url = new URL(action[1].replaceAll("&amp;", "&"), url).href;
    form = prompt[1] === "login"
      ? { prompt: "login", login, password: "any password works at this provider" }
      : { prompt: prompt[1] };
  }
  throw new Error("the provider never sent the browser back");
}

test("SSO callbacks and ID tokens cannot be replayed", { timeout: 180_000 }, async (t) => {
  const [port, opPort] = [await freePort(), await freePort()];
  const base = `http://127.0.0.1:${port}`;
  const callback = `${base}/admin/sso/callback`;
  const logs = fs.mkdtempSync(path.join(os.tmpdir(), "sso-replay-"));

  const op = spawn(process.execPath, [path.join(here, "op.mjs"), "--port", String(opPort),
    "--redirect-uri", callback, "--client-secret", clientSecret],
  { stdio: ["ignore", "pipe", fs.openSync(path.join(logs, "op.log"), "w")] });
  t.after(() => op.kill("SIGTERM"));
  const { issuer } = await new Promise((resolve, reject) => {
    op.once("exit", (code) => reject(new Error(`op.mjs exited (${code})`)));
    readline.createInterface({ input: op.stdout }).once("line", (l) => resolve(JSON.parse(l)));
  });

  const log = path.join(logs, "toolgate.log");
  const server = spawn(bin, ["serve", "--database-url", `${pgBase}/${database}`,
    "--bind", `127.0.0.1:${port}`,
    "--tools-dir", path.join(root, "tools"), "--policies-dir", path.join(root, "policies"),
    "--oidc-issuer", issuer, "--oidc-client-id", "toolgate",
    "--oidc-scope", "profile,email,groups", "--oidc-role-claim", "groups",
    "--oidc-role-map", "toolgate-admins=admin,toolgate-auditors=auditor"],
  {
    // Identical refusals from one address are summarised: within a second here.
    env: { ...cleanEnv(), TOOLGATE_OIDC_CLIENT_SECRET: clientSecret, TOOLGATE_REFUSAL_SUMMARY_SECS: "1" },
    stdio: ["ignore", fs.openSync(log, "w"), fs.openSync(log, "a")],
  });
  t.after(async () => {
    server.kill("SIGTERM");
    await new Promise((r) => (server.exitCode !== null ? r() : server.once("exit", r)));
    spawnSync("psql", [`${pgBase}/postgres`, "-qc", `DROP DATABASE IF EXISTS "${database}" WITH (FORCE)`]);
  });
  for (let i = 0; ; i++) {
    if (server.exitCode !== null) throw new Error(`toolgate exited:\n${fs.readFileSync(log, "utf8")}`);
    try {
      if ((await fetch(`${base}/readyz`)).ok) break;
    } catch { /* not listening yet */ }
    assert.ok(i < 240, `toolgate not ready:\n${fs.readFileSync(log, "utf8")}`);
    await new Promise((r) => setTimeout(r, 250));
  }

  /// Starts a sign-in at toolgate: the provider URL it sends the browser to, and the flow
  /// cookie it sets (the browser's proof that it started this sign-in).
  async function start() {
    const r = await fetch(`${base}/admin/sso/start`, { redirect: "manual" });
    assert.equal(r.status, 303, await r.text());
    const flow = setCookies(r).toolgate_sso;
    assert.ok(flow);
    return { authUrl: r.headers.get("location"), flow };
  }

  /// Presents a callback URL with a flow cookie, as a browser would.
  async function present(url, flow) {
    const r = await fetch(url, { redirect: "manual", headers: { cookie: `toolgate_sso=${flow}` } });
    return { status: r.status, session: setCookies(r).toolgate_session ?? null, text: await r.text() };
  }

  function withNonce(authUrl, nonce) {
    const u = new URL(authUrl);
    assert.ok(u.searchParams.get("nonce"), "the authorization request carries a nonce");
    u.searchParams.set("nonce", nonce);
    return u.href;
  }

  /// Refused sign-ins on record, by reason: a row each, or the count of a row summarising
  /// identical refusals from one address (written within a second, see the flag above).
  async function refusals(want) {
    let seen = {};
    for (let i = 0; i < 100; i++) {
      const q = spawnSync("psql", [`${pgBase}/${database}`, "-tAF|", "-c",
        "SELECT COALESCE(details::jsonb #>> '{summary,reason}', error),"
        + " COALESCE((details::jsonb #>> '{summary,repeats}')::int, 1)"
        + " FROM audit_events WHERE event_type = 'admin.login' AND outcome = 'denied'"]);
      seen = {};
      for (const line of q.stdout.toString().trim().split("\n").filter(Boolean)) {
        const [reason, n] = line.split("|");
        seen[reason] = (seen[reason] ?? 0) + Number(n);
      }
      if (JSON.stringify(Object.entries(seen).sort()) === JSON.stringify(Object.entries(want).sort())) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    return seen;
  }

  // A sign-in as it should be: accepted.
  const a = await start();
  const aBack = await providerSignIn(a.authUrl, "alice", callback);
  const first = await present(aBack, a.flow);
  assert.equal(first.status, 200, first.text);
  assert.ok(first.session, "the first callback opened a session");
  const usedNonce = new URL(a.authUrl).searchParams.get("nonce");

  // 1. The same callback again, cookie and all (a replay from history, a proxy log, a
  // Referer): the state was spent by the first use.
  const replayed = await present(aBack, a.flow);
  assert.equal(replayed.status, 403, replayed.text);
  assert.equal(replayed.session, null);

  // 2. A fresh callback carried into another browser's sign-in (login CSRF): the state is not
  // the one that browser's cookie holds.
  const b = await start();
  const c = await start();
  const bBack = await providerSignIn(b.authUrl, "alice", callback);
  const crossed = await present(bBack, c.flow);
  assert.equal(crossed.status, 403, crossed.text);
  assert.equal(crossed.session, null);

  // 3. An ID token with a nonce this sign-in did not ask for: the provider signs what the
  // authorization request said, so the request is altered on its way to the provider.
  const d = await start();
  const dBack = await providerSignIn(withNonce(d.authUrl, crypto.randomBytes(16).toString("base64url")), "alice", callback);
  const madeUp = await present(dBack, d.flow);
  assert.equal(madeUp.status, 403, madeUp.text);
  assert.equal(madeUp.session, null);

  // 4. An ID token carrying the nonce of the earlier, completed sign-in.
  const e = await start();
  const eBack = await providerSignIn(withNonce(e.authUrl, usedNonce), "alice", callback);
  const oldNonce = await present(eBack, e.flow);
  assert.equal(oldNonce.status, 403, oldNonce.text);
  assert.equal(oldNonce.session, null);

  // Each refused for its own reason (and not, say, because the code exchange failed).
  const want = {
    "unknown or expired state": 1,
    "state mismatch": 1,
    "ID token did not verify": 2,
  };
  assert.deepEqual(await refusals(want), want);
  // The sign-in that was refused a crossed callback can still finish in its own browser.
  const own = await present(bBack, b.flow);
  assert.equal(own.status, 200, own.text);
  assert.ok(own.session);
});
