"""The official Python MCP SDK (`mcp`) with a token that renews itself.

    TOOLGATE_URL=https://toolgate.example.com CLIENT_ID=... CLIENT_SECRET=... python python_sdk.py

Lists the agent's tools and calls one; with `--outlive-token` it then waits past the token's
expiry and calls again on the same session (what CI runs, with 5-second tokens).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from toolgate_auth import client_credentials_auth

ClientCredentials = client_credentials_auth(httpx2)


async def main() -> None:
    base = os.environ["TOOLGATE_URL"]
    auth = ClientCredentials(base, os.environ["CLIENT_ID"], os.environ["CLIENT_SECRET"])
    async with httpx2.AsyncClient(auth=auth, timeout=30) as http:
        async with Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            print("tools:", ", ".join(sorted(tools)))
            result = await client.call_tool("search__query", {"q": "deploy rollback"})
            assert not result.is_error, result.content
            print("call: ok")
            if "--outlive-token" in sys.argv:
                await asyncio.sleep(max(0.0, auth.expires_at - time.time()) + 1.5)
                result = await client.call_tool("search__query", {"q": "on-call"})
                assert not result.is_error, result.content
                assert auth.fetched >= 2, f"the token was fetched {auth.fetched} time(s): it never expired"
                print(f"call after the first token expired: ok ({auth.fetched} tokens fetched)")

    if "--outlive-token" in sys.argv:
        # The same with no renewal ahead of time: the call after expiry is answered 401
        # (`error="invalid_token"`), and the Auth fetches a token and retries once.
        late = ClientCredentials(base, os.environ["CLIENT_ID"], os.environ["CLIENT_SECRET"], margin_secs=-3600)
        async with httpx2.AsyncClient(auth=late, timeout=30) as http:
            async with Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
                await client.list_tools()
                await asyncio.sleep(max(0.0, late.expires_at - time.time()) + 1.5)
                result = await client.call_tool("search__query", {"q": "incident"})
                assert not result.is_error, result.content
                assert late.fetched >= 2, f"no 401 led to a new token ({late.fetched} fetched)"
                print(f"call answered 401, renewed and retried: ok ({late.fetched} tokens fetched)")


if __name__ == "__main__":
    asyncio.run(main())
