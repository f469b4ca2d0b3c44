#!/usr/bin/env python3
"""An interactive host signs a person in through the official Python MCP SDK's OAuth client.

Run it against a running server with the example policies:

    TOOLGATE_URL=http://127.0.0.1:8787 TOOLGATE_ADMIN_TOKEN=xyz python tests/clients/host_oauth_test.py

Through the admin API it creates a person (a `member` account), lets them act as agent
`assistant`, and registers a public client (a host without a metadata document). Then the SDK's
`OAuthClientProvider`, unmodified, discovers the authorization server from the 401, sends the
person's "browser" to `/oauth/authorize` with PKCE S256, `state` and `resource`; the browser
(plain HTTP with a cookie jar, as a person's would: sign-in form, consent form) signs in,
chooses `assistant` and hands the code back; the SDK exchanges it and lists the tools. Checks:
exactly the assistant's tools, the token names the agent and carries the person (`act`), the
audit log finds the list by the person, a refresh rotates, and revoking the authorization ends
the token. The last line is `N passed, N failed`; the exit status is non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import html
import os
import re
import secrets
import sys
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata

import mcp_client_test as base
from mcp_client_test import R, check, connect, expect, jwt_claims, tool_names

# New names each run: the test may run twice against one server.
PERSON = f"py-host-{secrets.token_hex(4)}"
CLIENT_ID = f"py-sdk-host-{secrets.token_hex(4)}"
# Never listened on: the person's browser stops at the redirect and hands its query over.
REDIRECT = "http://127.0.0.1:9/callback"
ASSISTANT_TOOLS = ["search__get", "search__query"]


def form_fields(page: str) -> dict[str, str]:
    """The hidden fields and the first checked radio of the page's form."""
    fields = {}
    for m in re.finditer(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page):
        fields[html.unescape(m.group(1))] = html.unescape(m.group(2))
    return fields


class PersonsBrowser:
    """What a person's browser does between the host's redirect and the host's callback."""

    def __init__(self, base_url: str, password: str) -> None:
        self.base = base_url
        self.password = password
        self.http = httpx2.AsyncClient(timeout=30, follow_redirects=False)
        self.code: str | None = None
        self.state: str | None = None
        self.iss: str | None = None
        self.consented_agents: list[str] = []

    async def follow(self, url: str) -> httpx2.Response:
        """GETs `url` and its redirects while they stay on the gateway."""
        for _ in range(10):
            r = await self.http.get(url)
            if r.status_code not in (302, 303, 307):
                return r
            url = urljoin(url, r.headers["location"])
            if not url.startswith(self.base):
                raise base.CheckFailed(f"redirected off the gateway before consent: {url}")
        raise base.CheckFailed("too many redirects")

    async def open(self, authorize_url: str) -> None:
        q = parse_qs(urlparse(authorize_url).query)
        expect(q.get("code_challenge_method") == ["S256"], f"the SDK did not send S256: {q}")
        expect("state" in q and "resource" in q, f"no state or resource from the SDK: {q}")
        page = await self.follow(authorize_url)
        if "/admin/login" in str(page.url):
            fields = form_fields(page.text)
            fields.update(username=PERSON, password=self.password)
            r = await self.http.post(f"{self.base}/admin/login", data=fields)
            expect(r.status_code == 303, f"sign-in -> {r.status_code} {r.text[:300]}")
            page = await self.follow(urljoin(self.base, r.headers["location"]))
        expect(page.status_code == 200 and "/admin/consent" in str(page.url), f"no consent page: {page.url} {page.status_code}")
        self.consented_agents = re.findall(r'name="agent" value="([^"]+)"', page.text)
        fields = form_fields(page.text)
        fields.update(agent="assistant", decision="allow")
        r = await self.http.post(f"{self.base}/admin/consent", data=fields)
        expect(r.status_code == 303, f"consent -> {r.status_code} {r.text[:300]}")
        back = r.headers["location"]
        expect(back.startswith(REDIRECT + "?"), f"consent sent the browser to {back}")
        answer = parse_qs(urlparse(back).query)
        self.code, self.state = answer["code"][0], answer["state"][0]
        self.iss = answer.get("iss", [None])[0]

    async def callback(self) -> AuthorizationCodeResult:
        expect(self.code is not None, "the SDK asked for the callback before the browser had a code")
        # The SDK checks `iss` (RFC 9207) against the issuer it discovered.
        return AuthorizationCodeResult(code=self.code, state=self.state, iss=self.iss)


async def run(gw: base.Gateway) -> None:
    password = secrets.token_urlsafe(18)
    r = await gw.http.post(
        f"{gw.base}/api/v1/users", headers=gw.admin, json={"username": PERSON, "password": password, "role": "member"}
    )
    expect(r.status_code in (200, 201), f"POST /api/v1/users -> {r.status_code} {r.text}")
    r = await gw.http.put(f"{gw.base}/api/v1/agents/assistant/users/{PERSON}", headers=gw.admin)
    expect(r.status_code == 204, f"PUT agent user -> {r.status_code} {r.text}")
    r = await gw.http.put(
        f"{gw.base}/api/v1/public-clients/{CLIENT_ID}",
        headers=gw.admin,
        json={"client_name": "Python SDK host", "redirect_uris": [REDIRECT]},
    )
    expect(r.status_code in (200, 201, 204), f"PUT public client -> {r.status_code} {r.text}")

    browser = PersonsBrowser(gw.base, password)
    storage = base.MemoryTokenStorage()
    # A host registered by an admin: the SDK is told its client id and does not register.
    storage.client_info = OAuthClientInformationFull(
        client_id=CLIENT_ID,
        redirect_uris=[REDIRECT],
        token_endpoint_auth_method="none",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        client_name="Python SDK host",
    )
    provider = OAuthClientProvider(
        server_url=gw.mcp_url,
        client_metadata=OAuthClientMetadata(
            redirect_uris=[REDIRECT],
            token_endpoint_auth_method="none",
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            client_name="Python SDK host",
        ),
        storage=storage,
        redirect_handler=browser.open,
        callback_handler=browser.callback,
    )

    async with check("[host] OAuthClientProvider: 401 discovery, sign-in, consent, code + PKCE, tools/list"):
        # The first mode signs in; the others reuse the SDK's stored token.
        for mode in base.MODES:
            async with connect(gw.mcp_url, mode, auth=provider) as client:
                names = await tool_names(client)
            expect(names == ASSISTANT_TOOLS, f"{mode}: the host sees {names}, not exactly {ASSISTANT_TOOLS}")
        expect(browser.consented_agents == ["assistant"], f"consent offered {browser.consented_agents}")

    tokens = storage.tokens
    expect(tokens is not None and tokens.refresh_token, "the SDK stored no refresh token")
    claims = jwt_claims(tokens.access_token)

    async with check("[host] the token is the agent's and carries the person and the host"):
        expect(claims["sub"] == "assistant", f"sub {claims['sub']}")
        expect(claims.get("act") == {"sub": PERSON}, f"act {claims.get('act')}")
        expect(claims.get("client_id") == CLIENT_ID, f"client_id {claims.get('client_id')}")

    async with check("[host] the audit log finds the list by the person, with agent and host"):
        events: list = []
        for _ in range(100):  # the writer commits in batches; the API reads what is committed
            r = await gw.http.get(f"{gw.base}/api/v1/audit", headers=gw.admin, params={"person": PERSON})
            expect(r.status_code == 200, f"GET /api/v1/audit -> {r.status_code} {r.text}")
            events = [e for e in r.json()["events"] if e["event_type"] == "tools/list"]
            if events:
                break
            await asyncio.sleep(0.05)
        expect(events, "no tools/list row names the person")
        for e in events:
            expect(e["person"] == PERSON and e["agent"] == "assistant" and e["client_id"] == CLIENT_ID, f"row {e}")

    async with check("[host] a refresh rotates the refresh token; revoking the authorization ends the access token"):
        r = await gw.http.post(
            f"{gw.base}/oauth/token",
            data={"grant_type": "refresh_token", "refresh_token": tokens.refresh_token, "client_id": CLIENT_ID},
        )
        expect(r.status_code == 200, f"refresh -> {r.status_code} {r.text}")
        fresh = r.json()
        expect(fresh["refresh_token"] != tokens.refresh_token, "the refresh token did not rotate")
        r = await gw.http.delete(f"{gw.base}/api/v1/authorizations/{claims['authorization_id']}", headers=gw.admin)
        expect(r.status_code == 204, f"DELETE authorization -> {r.status_code} {r.text}")
        r = await gw.http.post(
            gw.mcp_url,
            headers={
                "Authorization": f"Bearer {fresh['access_token']}",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-11-25",
            },
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        )
        expect(r.status_code == 401, f"tools/list after revocation -> {r.status_code}")

    await browser.http.aclose()


async def main() -> int:
    url = os.environ.get("TOOLGATE_URL", "http://127.0.0.1:8787")
    admin = os.environ.get("TOOLGATE_ADMIN_TOKEN")
    if not admin:
        print("TOOLGATE_ADMIN_TOKEN is required", file=sys.stderr)
        return 2
    gw = base.Gateway(url, admin)
    try:
        await run(gw)
    finally:
        await gw.close()
    return base.finish()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
