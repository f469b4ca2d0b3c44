"""The OpenAI Agents SDK's MCP server object with a token that renews itself.

    TOOLGATE_URL=https://toolgate.example.com CLIENT_ID=... CLIENT_SECRET=... python openai_agents.py

`MCPServerStreamableHttp` takes an httpx `auth`; the agent then uses the server as any other
(`Agent(mcp_servers=[server])`). This recipe exercises the server object alone (no model, no
API key): list, call, and with `--outlive-token` a call after the first token expired.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import httpx
from agents.mcp import MCPServerStreamableHttp

from toolgate_auth import client_credentials_auth

ClientCredentials = client_credentials_auth(httpx)


async def main() -> None:
    base = os.environ["TOOLGATE_URL"].rstrip("/")
    auth = ClientCredentials(base, os.environ["CLIENT_ID"], os.environ["CLIENT_SECRET"])
    server = MCPServerStreamableHttp(name="toolgate", params={"url": f"{base}/mcp", "auth": auth})
    async with server:
        tools = [t.name for t in await server.list_tools()]
        print("tools:", ", ".join(sorted(tools)))
        result = await server.call_tool("search__query", {"q": "deploy rollback"})
        assert not result.isError, result.content
        print("call: ok")
        if "--outlive-token" in sys.argv:
            await asyncio.sleep(max(0.0, auth.expires_at - time.time()) + 1.5)
            result = await server.call_tool("search__query", {"q": "on-call"})
            assert not result.isError, result.content
            assert auth.fetched >= 2, f"the token was fetched {auth.fetched} time(s): it never expired"
            print(f"call after the first token expired: ok ({auth.fetched} tokens fetched)")


if __name__ == "__main__":
    asyncio.run(main())
