#!/usr/bin/env python3
"""MCP Apps through toolgate, with the official Python SDK on both sides.

The upstream is tests/clients/app_fixture_server.py (an SDK server with an App), declared
through the admin API and spawned by the gateway over stdio. With the SDK client, in the
legacy and the 2026-07-28 eras, it checks: the tool keeps its `_meta.ui` (its `ui://` URI
rewritten under the group), the granted agent reads the UI resource with its CSP intact, an
agent without the grant cannot read it, and the app-only tool is a tool like any other.

    TOOLGATE_URL=http://127.0.0.1:8787 TOOLGATE_ADMIN_TOKEN=xyz python tests/clients/mcp_apps_test.py
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

BASE = os.environ.get("TOOLGATE_URL", "http://127.0.0.1:8787").rstrip("/")
ADMIN = {"Authorization": f"Bearer {os.environ.get('TOOLGATE_ADMIN_TOKEN', '')}"}
FIXTURE = pathlib.Path(__file__).with_name("app_fixture_server.py").resolve()
UI_URI = "ui://clock/clock/app.html"
failures: list[str] = []


def check(cond: bool, what: str) -> None:
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


async def token_for(http: httpx2.AsyncClient, agent: str, grant: str) -> str:
    await http.post(f"{BASE}/api/v1/agents", headers=ADMIN, json={"name": agent})
    await http.post(f"{BASE}/api/v1/agents/{agent}/grants", headers=ADMIN, json={"target": grant})
    c = (await http.post(f"{BASE}/api/v1/agents/{agent}/clients", headers=ADMIN)).json()
    t = await http.post(
        f"{BASE}/oauth/token",
        auth=(c["client_id"], c["client_secret"]),
        data={"grant_type": "client_credentials", "resource": f"{BASE}/mcp"},
    )
    return t.json()["access_token"]


def client(token: str, mode: str) -> tuple[httpx2.AsyncClient, Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return http, Client(streamable_http_client(f"{BASE}/mcp", http_client=http), mode=mode, cache=None)


async def main() -> int:
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.put(
            f"{BASE}/api/v1/upstreams/clock",
            headers=ADMIN,
            json={"transport": "stdio", "command": sys.executable, "args": [str(FIXTURE)], "refresh_secs": 2},
        )
        check(r.status_code == 204, f"declare the App upstream ({r.status_code} {r.text})")
        user = await token_for(http, "app-user", "clock")
        stranger = await token_for(http, "app-stranger", "search")

    for mode in ("legacy", "2026-07-28"):
        http, c = client(user, mode)
        async with http, c:
            tools = []
            for _ in range(100):
                tools = (await c.list_tools()).tools
                if tools:
                    break
                await asyncio.sleep(0.2)
            by_name = {t.name: t for t in tools}
            check(set(by_name) == {"clock__get_time", "clock__app_refresh"}, f"[{mode}] the App's tools are listed: {sorted(by_name)}")
            meta = (by_name.get("clock__get_time").meta or {}) if "clock__get_time" in by_name else {}
            check(meta.get("ui", {}).get("resourceUri") == UI_URI, f"[{mode}] _meta.ui.resourceUri is rewritten under the group: {meta}")
            app_only = (by_name.get("clock__app_refresh").meta or {}) if "clock__app_refresh" in by_name else {}
            check(app_only.get("ui", {}).get("visibility") == ["app"], f"[{mode}] app-only visibility passes through: {app_only}")
            res = await c.read_resource(UI_URI)
            content = res.contents[0]
            check("<main id=\"clock\">" in getattr(content, "text", ""), f"[{mode}] the granted agent reads the UI")
            check(str(content.uri) == UI_URI, f"[{mode}] the content carries our URI: {content.uri}")
            check(content.mime_type == "text/html;profile=mcp-app", f"[{mode}] MIME type: {content.mime_type}")
            csp = ((content.meta or {}).get("ui") or {}).get("csp") or {}
            check(
                csp.get("connectDomains") == ["https://time.example"] and csp.get("resourceDomains") == ["https://cdn.example"],
                f"[{mode}] the CSP domains pass through unchanged: {csp}",
            )
            called = await c.call_tool("clock__app_refresh", {})
            check(not called.is_error and "refreshed" in called.content[0].text, f"[{mode}] the app-only tool is callable by its grantee")

        http, c = client(stranger, mode)
        async with http, c:
            try:
                await c.read_resource(UI_URI)
                check(False, f"[{mode}] an agent without the grant cannot read the UI")
            except MCPError:
                check(True, f"[{mode}] an agent without the grant cannot read the UI")
            names = [t.name for t in (await c.list_tools()).tools]
            check(not any(n.startswith("clock__") for n in names), f"[{mode}] the App's tools are invisible to others: {names}")

    async with httpx2.AsyncClient(timeout=30) as http:
        await http.delete(f"{BASE}/api/v1/upstreams/clock", headers=ADMIN)
    print(f"{'FAILED' if failures else 'ok'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
