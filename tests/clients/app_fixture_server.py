#!/usr/bin/env python3
"""A small MCP server with an MCP App, written with the official Python SDK, used as an
upstream behind toolgate by tests/clients/mcp_apps_test.py (spawned over stdio).

It exposes `get_time` (linked to the UI `ui://clock/app.html`, with CSP domains the gateway
must not widen) and `app_refresh`, an app-only tool (`visibility: ["app"]`).
"""

from mcp.server import MCPServer
from mcp.server.apps import Apps, ResourceCsp

CLOCK_HTML = """<!doctype html><html><head><title>Clock</title></head>
<body><main id="clock">--:--</main></body></html>"""

apps = Apps()


@apps.tool(resource_uri="ui://clock/app.html", description="The current time, with a clock UI.")
def get_time() -> str:
    return "2026-11-30T12:00:00Z"


@apps.tool(resource_uri="ui://clock/app.html", visibility=["app"], description="Refresh the clock (called by the UI).")
def app_refresh() -> str:
    return "refreshed"


apps.add_html_resource(
    "ui://clock/app.html",
    CLOCK_HTML,
    csp=ResourceCsp(connect_domains=["https://time.example"], resource_domains=["https://cdn.example"]),
)

server = MCPServer("clock-app", extensions=[apps])

if __name__ == "__main__":
    server.run("stdio")
