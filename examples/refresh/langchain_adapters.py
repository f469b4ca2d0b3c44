"""LangChain's MCP adapters with a token that renews itself.

    TOOLGATE_URL=https://toolgate.example.com CLIENT_ID=... CLIENT_SECRET=... python langchain_adapters.py

`MultiServerMCPClient` takes an httpx `auth` per server; the tools it returns go to any
LangChain agent. This recipe invokes a tool directly (no model): list, call, and with
`--outlive-token` a call after the first token expired.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import httpx
from langchain_mcp_adapters.client import MultiServerMCPClient

from toolgate_auth import client_credentials_auth

ClientCredentials = client_credentials_auth(httpx)


async def main() -> None:
    base = os.environ["TOOLGATE_URL"].rstrip("/")
    auth = ClientCredentials(base, os.environ["CLIENT_ID"], os.environ["CLIENT_SECRET"])
    client = MultiServerMCPClient({"toolgate": {"transport": "streamable_http", "url": f"{base}/mcp", "auth": auth}})
    tools = {t.name: t for t in await client.get_tools()}
    print("tools:", ", ".join(sorted(tools)))
    out = await tools["search__query"].ainvoke({"q": "deploy rollback"})
    assert "rollback" in str(out).lower(), out
    print("call: ok")
    if "--outlive-token" in sys.argv:
        await asyncio.sleep(max(0.0, auth.expires_at - time.time()) + 1.5)
        out = await tools["search__query"].ainvoke({"q": "on-call"})
        assert "on-call" in str(out).lower() or "oncall" in str(out).lower(), out
        assert auth.fetched >= 2, f"the token was fetched {auth.fetched} time(s): it never expired"
        print(f"call after the first token expired: ok ({auth.fetched} tokens fetched)")


if __name__ == "__main__":
    asyncio.run(main())
