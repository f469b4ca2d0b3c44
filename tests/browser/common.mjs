// What every browser test needs: where toolgate and Chromium are, a free port, an environment
// with no TOOLGATE_* variable leaking in, and a wait for a server's /readyz.

import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const bin = process.env.TOOLGATE_BIN || path.join(root, "target/debug/toolgate");
export const pgBase = process.env.PG_BASE || "postgres://root@127.0.0.1:5432";
export const chromiumPath = process.env.CHROMIUM || "/usr/bin/chromium";
export const shots = path.resolve(process.env.SCREENSHOT_DIR || path.join(root, "target/browser-screenshots"));
// Without the background-networking flags, Chromium keeps trying the closed network.
export const chromiumArgs = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

// Every toolgate flag also reads a TOOLGATE_* variable: none may leak in.
export function cleanEnv() {
  const env = { ...process.env };
  for (const k of Object.keys(env)) if (k.startsWith("TOOLGATE_")) delete env[k];
  return env;
}

// Polling /readyz is the only signal a child server gives that it is ready.
export async function waitReady(url, server, log) {
  for (let i = 0; i < 240; i++) {
    if (server.exitCode !== null) throw new Error(`toolgate exited early:\n${fs.readFileSync(log, "utf8")}`);
    try {
      const r = await fetch(`${url}/readyz`);
      if (r.ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`toolgate was not ready after 60 s:\n${fs.readFileSync(log, "utf8")}`);
}
