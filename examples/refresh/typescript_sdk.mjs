// The official TypeScript MCP SDK with client-credentials tokens that renew themselves.
//
//   TOOLGATE_URL=https://toolgate.example.com CLIENT_ID=... CLIENT_SECRET=... node typescript_sdk.mjs
//
// The SDK's own ClientCredentialsProvider does it: the transport's first request is answered
// 401 with the resource metadata, the SDK finds toolgate's token endpoint from it, asks for a
// token, and retries; when a token expires the next request is answered 401
// (`error="invalid_token"`) and the same happens again. With `--outlive-token` it waits past
// the first token's expiry and calls again on the same session (what CI runs, with 5-second
// tokens).

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ClientCredentialsProvider } from "@modelcontextprotocol/sdk/client/auth-extensions.js";

const base = process.env.TOOLGATE_URL.replace(/\/$/, "");
const provider = new ClientCredentialsProvider({
  clientId: process.env.CLIENT_ID,
  clientSecret: process.env.CLIENT_SECRET,
});
const client = new Client({ name: "refresh-recipe", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), { authProvider: provider }));

const { tools } = await client.listTools();
console.log("tools:", tools.map((t) => t.name).sort().join(", "));
let result = await client.callTool({ name: "search__query", arguments: { q: "deploy rollback" } });
if (result.isError) throw new Error(JSON.stringify(result.content));
console.log("call: ok");

if (process.argv.includes("--outlive-token")) {
  const first = provider.tokens().access_token;
  const { exp } = JSON.parse(Buffer.from(first.split(".")[1], "base64url"));
  await new Promise((r) => setTimeout(r, Math.max(0, exp * 1000 - Date.now()) + 1500));
  result = await client.callTool({ name: "search__query", arguments: { q: "on-call" } });
  if (result.isError) throw new Error(JSON.stringify(result.content));
  if (provider.tokens().access_token === first) throw new Error("the call after expiry used the expired token");
  console.log("call after the first token expired: ok (a new token was fetched)");
}
await client.close();
