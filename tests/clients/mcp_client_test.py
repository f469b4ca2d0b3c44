#!/usr/bin/env python3
"""End-to-end test of a running toolgate with the official Python MCP SDK (`mcp` 2.x).

Run it against a server started with an admin token:

    TOOLGATE_URL=http://127.0.0.1:8787 TOOLGATE_ADMIN_TOKEN=xyz \
        python tests/clients/mcp_client_test.py

(or pass --base-url / --admin-token). The server must have the example `tools/` and
`policies/` loaded: agent `assistant` granted `search`, agent `meteo` granted `weather`.

For each connect mode of the SDK client (`legacy`: the 2025-11-25 initialize handshake;
`2026-07-28`: pinned modern, stateless; `auto`: server/discover, falling back to legacy) it
checks what each agent sees and may call, and that grants changed through the admin API
take effect as designed: a new grant arrives with the next token, a removed grant is gone on
the very next request. One pass goes through the SDK's own OAuth client
(`ClientCredentialsOAuthProvider`), which discovers the authorization server from the 401.

The client's response cache is disabled (`cache=None`) so every `tools/list` reaches the
server. Every check prints one PASS/FAIL line; the last line is `N passed, N failed` and the
exit status is non-zero if any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import sys
import traceback
import warnings
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import SubscriptionLost, ToolsListChanged
from mcp.shared.auth import OAuthClientInformationFull, OAuthMetadata, OAuthToken
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

MODES = ("legacy", "2026-07-28", "auto")
EXPECTED_VERSION = {"legacy": "2025-11-25", "2026-07-28": "2026-07-28", "auto": "2026-07-28"}
SEARCH_TOOLS = ["search__get", "search__query"]
WEATHER_TOOLS = ["weather__current", "weather__forecast"]
INVALID_PARAMS = -32602


class CheckFailed(Exception):
    pass


class Results:
    def __init__(self) -> None:
        self.passed: list[str] = []
        self.failed: list[tuple[str, str]] = []
        self.notes: list[str] = []

    def ok(self, name: str, detail: str = "") -> None:
        self.passed.append(name)
        print(f"PASS  {name}" + (f"  ({detail})" if detail else ""), flush=True)

    def fail(self, name: str, detail: str) -> None:
        self.failed.append((name, detail))
        print(f"FAIL  {name}\n      {detail}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"NOTE  {text}", flush=True)


R = Results()


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio wraps transport errors in one)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def describe(exc: BaseException) -> str:
    leaf = root_cause(exc)
    if isinstance(leaf, MCPError):
        return f"MCPError {leaf.code}: {leaf.message}"
    return f"{type(leaf).__name__}: {leaf}"


@contextlib.asynccontextmanager
async def check(name: str) -> AsyncIterator[None]:
    """Run one check: a CheckFailed or any exception marks it failed, and the run goes on."""
    try:
        yield
    except CheckFailed as e:
        R.fail(name, str(e))
    except Exception as e:  # noqa: BLE001 - any error is this check's failure, reported once
        R.fail(name, describe(e))
        if os.environ.get("TOOLGATE_TEST_TRACEBACKS"):
            traceback.print_exception(e)
    else:
        R.ok(name)


def expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


def jwt_claims(token: str) -> dict[str, Any]:
    """The token's claims, unverified: only to show what the server put in it."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


class Gateway:
    """The admin API and the token endpoint, over plain HTTP."""

    def __init__(self, base: str, admin_token: str) -> None:
        self.base = base.rstrip("/")
        self.mcp_url = self.base + "/mcp"
        self.http = httpx2.AsyncClient(timeout=30)
        self.admin = {"Authorization": f"Bearer {admin_token}"}

    async def close(self) -> None:
        await self.http.aclose()

    async def create_client(self, agent: str) -> dict[str, str]:
        r = await self.http.post(f"{self.base}/api/v1/agents/{agent}/clients", headers=self.admin, json={})
        expect(r.status_code in (200, 201), f"POST /api/v1/agents/{agent}/clients -> {r.status_code} {r.text}")
        body = r.json()
        expect("client_id" in body and "client_secret" in body, f"no client_id/client_secret in {body}")
        return body

    async def token(self, cred: dict[str, str], scope: str | None = None) -> str:
        data = {"grant_type": "client_credentials", "resource": self.mcp_url}
        if scope is not None:
            data["scope"] = scope
        r = await self.http.post(f"{self.base}/oauth/token", auth=(cred["client_id"], cred["client_secret"]), data=data)
        expect(r.status_code == 200, f"POST /oauth/token -> {r.status_code} {r.text}")
        return r.json()["access_token"]

    async def add_grant(self, agent: str, target: str) -> None:
        r = await self.http.post(
            f"{self.base}/api/v1/agents/{agent}/grants", headers=self.admin, json={"target": target}
        )
        expect(r.status_code in (200, 201), f"POST /api/v1/agents/{agent}/grants {target} -> {r.status_code} {r.text}")

    async def set_rules(self, agent: str, target: str, rules: dict[str, Any]) -> dict[str, Any]:
        r = await self.http.put(f"{self.base}/api/v1/agents/{agent}/arguments/{target}", headers=self.admin, json=rules)
        expect(r.status_code == 200, f"PUT /api/v1/agents/{agent}/arguments/{target} -> {r.status_code} {r.text}")
        return r.json()

    async def delete_rules(self, agent: str, target: str) -> None:
        r = await self.http.delete(f"{self.base}/api/v1/agents/{agent}/arguments/{target}", headers=self.admin)
        expect(r.status_code in (204, 404), f"DELETE /api/v1/agents/{agent}/arguments/{target} -> {r.status_code} {r.text}")

    async def remove_grant(self, agent: str, target: str, missing_ok: bool = False) -> None:
        r = await self.http.delete(f"{self.base}/api/v1/agents/{agent}/grants/{target}", headers=self.admin)
        ok = r.status_code in (200, 204) or (missing_ok and r.status_code == 404)
        expect(ok, f"DELETE /api/v1/agents/{agent}/grants/{target} -> {r.status_code} {r.text}")


@contextlib.asynccontextmanager
async def connect(
    url: str, mode: str, token: str | None = None, auth: httpx2.Auth | None = None, transport: Any = None
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    kwargs: dict[str, Any] = {"headers": headers, "timeout": 30}
    if auth is not None:
        kwargs["auth"] = auth
    if transport is not None:
        kwargs["transport"] = transport
    async with httpx2.AsyncClient(**kwargs) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode, cache=None) as client:
            yield client


async def tool_names(client: Client) -> list[str]:
    names: list[str] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        names.extend(t.name for t in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return sorted(names)


async def expect_tools(client: Client, expected: list[str]) -> None:
    got = await tool_names(client)
    expect(got == sorted(expected), f"tools/list returned {got}, expected exactly {sorted(expected)}")


async def expect_unknown_tool(client: Client, name: str, args: dict[str, Any]) -> None:
    try:
        res = await client.call_tool(name, args)
    except MCPError as e:
        expect(
            e.code == INVALID_PARAMS,
            f"calling {name} raised JSON-RPC error {e.code} ({e.message}), expected {INVALID_PARAMS}",
        )
        return
    raise CheckFailed(f"calling {name} did not raise: is_error={res.is_error} content={res.content!r}")


async def expect_search_works(client: Client) -> None:
    res = await client.call_tool("search__query", {"q": "rollback"})
    expect(res.is_error is False, f"search__query is_error={res.is_error}, content={res.content!r}")
    sc = res.structured_content
    expect(isinstance(sc, dict) and "results" in sc, f"structuredContent has no `results`: {sc!r}")
    expect(isinstance(sc["results"], list) and len(sc["results"]) > 0, f"no results for `rollback`: {sc!r}")


def result_text(res: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in res.content or [])


async def run_mode(gw: Gateway, mode: str, assistant: dict[str, str], meteo: dict[str, str]) -> None:
    tag = f"[{mode}]"
    a_token = await gw.token(assistant)
    m_token = await gw.token(meteo)

    async with check(f"{tag} assistant connects, negotiated {EXPECTED_VERSION[mode]}"):
        async with connect(gw.mcp_url, mode, a_token) as client:
            expect(
                client.protocol_version == EXPECTED_VERSION[mode],
                f"negotiated {client.protocol_version}, expected {EXPECTED_VERSION[mode]}",
            )

    async with connect(gw.mcp_url, mode, a_token) as client:
        async with check(f"{tag} assistant lists exactly {SEARCH_TOOLS}"):
            await expect_tools(client, SEARCH_TOOLS)
        async with check(f"{tag} assistant search__query {{q: rollback}} -> structuredContent.results, is_error False"):
            await expect_search_works(client)
        async with check(f"{tag} assistant weather__current -> JSON-RPC error {INVALID_PARAMS} (unknown tool)"):
            await expect_unknown_tool(client, "weather__current", {"city": "Paris"})
        async with check(f"{tag} assistant search__query {{q: 5}} -> is_error True naming the violation"):
            res = await client.call_tool("search__query", {"q": 5})
            text = result_text(res)
            expect(res.is_error is True, f"is_error={res.is_error}, content={res.content!r}")
            expect("/q" in text or "`q`" in text or "'q'" in text, f"error text does not name the field q: {text!r}")
            expect("string" in text, f"error text does not say what was expected (string): {text!r}")

    async with connect(gw.mcp_url, mode, m_token) as client:
        async with check(f"{tag} meteo lists exactly {WEATHER_TOOLS}"):
            await expect_tools(client, WEATHER_TOOLS)

    # Grants: a token issued without a narrower scope follows the live grants, additions
    # included; a token issued for explicit scopes never widens.
    await gw.remove_grant("assistant", "weather", missing_ok=True)
    old_token = await gw.token(assistant)
    narrow_token = await gw.token(assistant, scope="tools:search")
    try:
        async with check(f"{tag} a token issued with no scope says scope `tools`, one for tools:search says so"):
            expect(jwt_claims(old_token).get("scope") == "tools", f"scope={jwt_claims(old_token).get('scope')!r}")
            expect(jwt_claims(narrow_token).get("scope") == "tools:search", f"scope={jwt_claims(narrow_token).get('scope')!r}")
        async with check(f"{tag} admin API adds grant `weather` to assistant"):
            await gw.add_grant("assistant", "weather")

        async with connect(gw.mcp_url, mode, old_token) as client:
            async with check(f"{tag} a token issued BEFORE the grant lists {SEARCH_TOOLS + WEATHER_TOOLS} on its next request"):
                await expect_tools(client, SEARCH_TOOLS + WEATHER_TOOLS)
            async with check(f"{tag} a token issued BEFORE the grant calls weather__current {{city: Paris}}"):
                res = await client.call_tool("weather__current", {"city": "Paris"})
                expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")

        async with connect(gw.mcp_url, mode, narrow_token) as client:
            async with check(f"{tag} a token issued for tools:search still lists only {SEARCH_TOOLS}"):
                await expect_tools(client, SEARCH_TOOLS)
            async with check(f"{tag} a token issued for tools:search still cannot call weather__current"):
                await expect_unknown_tool(client, "weather__current", {"city": "Paris"})

        async with connect(gw.mcp_url, mode, old_token) as client:
            async with check(f"{tag} admin API removes grant `weather` from assistant"):
                await gw.remove_grant("assistant", "weather")
            # Same connection, same token: the very next request must no longer see weather.
            async with check(f"{tag} right after removal, the token lists only {SEARCH_TOOLS}"):
                await expect_tools(client, SEARCH_TOOLS)
            async with check(f"{tag} right after removal, the token cannot call weather__current"):
                await expect_unknown_tool(client, "weather__current", {"city": "Paris"})
    finally:
        await gw.remove_grant("assistant", "weather", missing_ok=True)


class MemoryTokenStorage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class CompatTransport(httpx2.AsyncBaseTransport):
    """Rewrites the discovery documents, as the SDK's OAuth client sees them, to work around the
    incompatibilities that `diagnose_sdk_oauth` found (and only those).

    Used only after the unmodified flow failed, so that the rest of the SDK's flow (discovery
    from the 401, client_secret_basic, RFC 8707 `resource`, the token on every request) is still
    tested:
    - `fill_authorization_endpoint`: mcp's `OAuthMetadata` requires `authorization_endpoint`,
      which RFC 8414 lets a client-credentials-only server omit; one is filled in (never called).
    - `drop_scopes`: the SDK requests every scope of the protected resource metadata's
      `scopes_supported` (the MCP scope-selection strategy); when the token endpoint refuses that
      request, `scopes_supported` is dropped so that the SDK requests no scope.
    """

    def __init__(self, base: str, fill_authorization_endpoint: bool, drop_scopes: bool) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.base = base
        self.fill_authorization_endpoint = fill_authorization_endpoint
        self.drop_scopes = drop_scopes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        path = request.url.path
        if response.status_code == 200 and path.startswith("/.well-known/oauth-"):
            await response.aread()
            doc = json.loads(response.content)
            if self.fill_authorization_endpoint and path.startswith("/.well-known/oauth-authorization-server"):
                doc.setdefault("authorization_endpoint", self.base + "/oauth/authorize")
            if self.drop_scopes:
                doc.pop("scopes_supported", None)
            await response.aclose()
            return httpx2.Response(200, json=doc)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def sdk_oauth_pass(gw: Gateway, cred: dict[str, str], transport_factory: Any = None) -> None:
    """Every mode, assistant, through the SDK's ClientCredentialsOAuthProvider: one provider, so
    the first mode does the whole discovery and token request and the others reuse the token."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        provider = ClientCredentialsOAuthProvider(
            server_url=gw.mcp_url,
            storage=MemoryTokenStorage(),
            client_id=cred["client_id"],
            client_secret=cred["client_secret"],
            issuer=gw.base,
        )
    for mode in MODES:
        transport = transport_factory() if transport_factory else None
        async with connect(gw.mcp_url, mode, auth=provider, transport=transport) as client:
            await expect_tools(client, SEARCH_TOOLS)
            await expect_search_works(client)
            await expect_unknown_tool(client, "weather__current", {"city": "Paris"})


async def diagnose_sdk_oauth(gw: Gateway, cred: dict[str, str]) -> tuple[list[str], bool, bool]:
    """Why the SDK's OAuth client fails: the server-side causes we know of, each stated precisely."""
    problems: list[str] = []
    fill, drop = False, False
    r = await gw.http.get(gw.base + "/.well-known/oauth-authorization-server")
    try:
        OAuthMetadata.model_validate_json(r.content)
    except ValidationError as e:
        fill = True
        fields = ", ".join(".".join(str(x) for x in err["loc"]) + f" ({err['msg']})" for err in e.errors())
        problems.append(
            "GET /.well-known/oauth-authorization-server does not validate as mcp's OAuthMetadata: "
            f"{fields}; the SDK then finds no metadata for the issuer and stops"
        )
    r = await gw.http.get(gw.mcp_url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp"))
    scopes = r.json().get("scopes_supported") if r.status_code == 200 else None
    if scopes:
        t = await gw.http.post(
            gw.base + "/oauth/token",
            auth=(cred["client_id"], cred["client_secret"]),
            data={"grant_type": "client_credentials", "resource": gw.mcp_url, "scope": " ".join(scopes)},
        )
        if t.status_code != 200:
            drop = True
            problems.append(
                f"the SDK requests all of the PRM scopes_supported (scope={' '.join(scopes)!r}), and "
                f"POST /oauth/token answers {t.status_code} {t.text} instead of issuing the granted subset"
            )
    return problems, fill, drop


async def run_sdk_oauth(gw: Gateway, cred: dict[str, str], strict: bool) -> None:
    name = "[sdk-oauth] ClientCredentialsOAuthProvider: discover from 401, token, list+call in all modes"
    oauth_logger = logging.getLogger("mcp.client.auth")
    oauth_logger.setLevel(logging.CRITICAL)  # the SDK logs its own traceback; we report the cause once
    try:
        await sdk_oauth_pass(gw, cred)
    except Exception as e:  # noqa: BLE001
        reason = describe(e)
        problems, fill, drop = await diagnose_sdk_oauth(gw, cred)
        if strict or not problems:
            R.fail(name, reason + "".join(f"\n      cause: {p}" for p in problems))
            return
        R.note(f"the SDK's OAuth client fails against the unmodified server: {reason}")
        for p in problems:
            R.note(f"known cause: {p}")
        shim = f"CompatTransport(fill_authorization_endpoint={fill}, drop_scopes={drop})"
        async with check(f"{name} through {shim}; TOOLGATE_STRICT_SDK_OAUTH=1 forbids the shim"):
            await sdk_oauth_pass(gw, cred, lambda: CompatTransport(gw.base, fill, drop))
    else:
        R.ok(name)
    finally:
        oauth_logger.setLevel(logging.NOTSET)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("TOOLGATE_URL", "http://127.0.0.1:8787"))
    parser.add_argument("--admin-token", default=os.environ.get("TOOLGATE_ADMIN_TOKEN"))
    parser.add_argument(
        "--strict-sdk-oauth",
        action="store_true",
        default=os.environ.get("TOOLGATE_STRICT_SDK_OAUTH") == "1",
        help="fail if the SDK's OAuth client needs the compatibility shim",
    )
    args = parser.parse_args()
    if not args.admin_token:
        parser.error("an admin token is required: --admin-token or TOOLGATE_ADMIN_TOKEN")

    print(f"toolgate MCP client test against {args.base_url} (mcp SDK, modes {', '.join(MODES)})", flush=True)
    gw = Gateway(args.base_url, args.admin_token)
    try:
        try:
            assistant = await gw.create_client("assistant")
            meteo = await gw.create_client("meteo")
        except Exception as e:  # noqa: BLE001
            R.fail("admin API creates OAuth clients for assistant and meteo", describe(e))
            return finish()
        R.ok("admin API creates OAuth clients for assistant and meteo")

        for mode in MODES:
            try:
                await run_mode(gw, mode, assistant, meteo)
            except Exception as e:  # noqa: BLE001 - setup of a mode failed; its checks did not run
                R.fail(f"[{mode}] setup", describe(e))

        await run_sdk_oauth(gw, assistant, args.strict_sdk_oauth)
        await run_search_mode(gw)
        await run_index_mode(gw)
        try:
            await run_listen(gw)
        except Exception as e:  # noqa: BLE001
            R.fail("[listen] setup", describe(e))
        for mode in MODES:
            try:
                await run_argument_rules(gw, mode, meteo)
            except Exception as e:  # noqa: BLE001
                R.fail(f"[{mode}] argument rules setup", describe(e))
    finally:
        await gw.close()
    return finish()


def finish() -> int:
    print()
    if R.failed:
        print("FAILED checks:")
        for name, detail in R.failed:
            print(f"  - {name}: {detail}")
    if R.notes:
        print("Notes:")
        for n in R.notes:
            print(f"  - {n}")
    print(f"{len(R.passed)} passed, {len(R.failed)} failed")
    return 1 if R.failed else 0


async def next_event(sub: Any, seconds: float = 10) -> Any:
    """The subscription's next event, or TimeoutError: events are waited for, never slept on."""
    return await asyncio.wait_for(sub.__anext__(), seconds)


async def run_listen(gw: Gateway) -> None:
    """`subscriptions/listen` (2026-07-28): a client holding the stream is told
    `notifications/tools/list_changed` when a grant is added or removed, and the stream ends
    when its token is revoked. A 2025-era client, which has no stream here, is not promised one.
    Closed streams give their slot back (at most 16 per agent are held)."""
    agent = f"listener-{os.getpid()}"
    r = await gw.http.post(f"{gw.base}/api/v1/agents", headers=gw.admin, json={"name": agent})
    expect(r.status_code == 201, f"POST /api/v1/agents -> {r.status_code} {r.text}")
    await gw.add_grant(agent, "search")
    cred = await gw.create_client(agent)
    token = await gw.token(cred)

    async with check("[listen] a 2025-era client is not promised tools list_changed (no stream to push on)"):
        async with connect(gw.mcp_url, "legacy", token) as client:
            tools = client.server_capabilities.tools
            expect(tools is not None and not tools.list_changed, f"tools capability {tools!r}")

    async with check("[listen] auto: server/discover advertises tools.listChanged"):
        async with connect(gw.mcp_url, "auto", token) as client:
            tools = client.server_capabilities.tools
            expect(tools is not None and tools.list_changed is True, f"tools capability {tools!r}")

    async with connect(gw.mcp_url, "2026-07-28", token) as client:
        async with client.listen(tools_list_changed=True) as sub:
            async with check("[listen] the subscription is acknowledged with toolsListChanged"):
                expect(sub.honored.tools_list_changed is True, f"honored {sub.honored!r}")
            async with check("[listen] a grant added through the admin API is pushed as tools/list_changed"):
                await gw.add_grant(agent, "weather")
                event = await next_event(sub)
                expect(isinstance(event, ToolsListChanged), f"event {event!r}")
                names = await tool_names(client)
                expect(names == sorted(SEARCH_TOOLS + WEATHER_TOOLS), f"listed {names}")
            async with check("[listen] a grant removed is pushed too"):
                await gw.remove_grant(agent, "weather")
                event = await next_event(sub)
                expect(isinstance(event, ToolsListChanged), f"event {event!r}")
                await expect_tools(client, SEARCH_TOOLS)

    async with check("[listen] closed streams give their slot back: 20 in a row, then one more, acknowledged"):
        async with connect(gw.mcp_url, "2026-07-28", token) as client:
            for _ in range(21):
                async with client.listen(tools_list_changed=True) as sub:
                    expect(sub.honored.tools_list_changed is True, f"honored {sub.honored!r}")

    async with check("[listen] an agent holds at most 16 streams; the 17th is refused, another agent's is not"):
        other = await gw.token(await gw.create_client("meteo"))
        async with connect(gw.mcp_url, "2026-07-28", token) as client, contextlib.AsyncExitStack() as held:
            for _ in range(16):
                await held.enter_async_context(client.listen(tools_list_changed=True))
            # The SDK acknowledges before the server's handler runs; the refusal is the
            # stream's final answer, at once.
            try:
                async with client.listen(tools_list_changed=True) as sub:
                    event = await next_event(sub)
                    raise CheckFailed(f"a 17th stream of one agent went on: {event!r}")
            except (MCPError, SubscriptionLost) as e:
                cause = f"{e!r} {e.__cause__!r}"
                expect("too many open subscriptions" in cause, f"refused with {cause}")
            async with connect(gw.mcp_url, "2026-07-28", other) as meteo_client:
                async with meteo_client.listen(tools_list_changed=True) as sub:
                    expect(sub.honored.tools_list_changed is True, f"honored {sub.honored!r}")

    async with check("[listen] revoking the stream's token ends the stream"):
        doomed = await gw.token(cred)
        async with connect(gw.mcp_url, "2026-07-28", doomed) as client:
            async with client.listen(tools_list_changed=True) as sub:
                r = await gw.http.post(
                    f"{gw.base}/api/v1/tokens/revoke", headers=gw.admin, json={"jti": jwt_claims(doomed)["jti"]}
                )
                expect(r.status_code == 204, f"POST /api/v1/tokens/revoke -> {r.status_code} {r.text}")
                try:
                    event = await next_event(sub)
                    raise CheckFailed(f"the stream went on after revocation: {event!r}")
                except (StopAsyncIteration, SubscriptionLost):
                    pass


async def run_search_mode(gw: Gateway) -> None:
    """An agent in `discovery: search`, created through the admin API and granted `search` and
    `weather`: in every connect mode, tools/list is exactly the two meta-tools, search_tools
    returns granted tools' full definitions (structuredContent and the same JSON as text), and
    a found tool is callable by name and through call_tool; an ungranted tool is neither found
    nor callable."""
    agent = f"searcher-{os.getpid()}"
    async with check(f"[search] admin API creates agent {agent} (discovery: search) granted search and weather"):
        r = await gw.http.post(
            f"{gw.base}/api/v1/agents", headers=gw.admin, json={"name": agent, "discovery": "search"}
        )
        expect(r.status_code == 201, f"POST /api/v1/agents -> {r.status_code} {r.text}")
        await gw.add_grant(agent, "search")
        await gw.add_grant(agent, "weather")
    # Found tools are deliberately not in tools/list, so the SDK cannot validate their output
    # against a listed outputSchema and warns once per call; that is the design, not a fault.
    session_logger = logging.getLogger("client")  # mcp.client.session logs under this name
    session_logger.setLevel(logging.ERROR)
    try:
        token = await gw.token(await gw.create_client(agent))
        for mode in MODES:
            tag = f"[search/{mode}]"
            async with connect(gw.mcp_url, mode, token) as client:
                async with check(f"{tag} lists exactly [call_tool, search_tools]"):
                    await expect_tools(client, ["call_tool", "search_tools"])
                async with check(f"{tag} search_tools {{query: current weather in a city}} -> weather__current first"):
                    res = await client.call_tool("search_tools", {"query": "current weather in a city", "limit": 3})
                    expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")
                    sc = res.structured_content
                    expect(isinstance(sc, dict) and isinstance(sc.get("tools"), list), f"structuredContent={sc!r}")
                    names = [t.get("name") for t in sc["tools"]]
                    expect(names[:1] == ["weather__current"], f"found {names}")
                    expect(all("inputSchema" in t for t in sc["tools"]), "a definition has no inputSchema")
                    expect(json.loads(result_text(res)) == sc, "the text content is not the structuredContent JSON")
                async with check(f"{tag} calls the found weather__current directly by name"):
                    res = await client.call_tool("weather__current", {"city": "Paris"})
                    expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")
                    expect((res.structured_content or {}).get("city") == "Paris", f"{res.structured_content!r}")
                async with check(f"{tag} call_tool {{name: weather__current, arguments: {{city: Paris}}}}"):
                    res = await client.call_tool("call_tool", {"name": "weather__current", "arguments": {"city": "Paris"}})
                    expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")
                    expect((res.structured_content or {}).get("city") == "Paris", f"{res.structured_content!r}")
                async with check(f"{tag} ungranted text__wordcount: never found, call_tool refuses it"):
                    res = await client.call_tool("search_tools", {"query": "count the words of a text", "limit": 20})
                    names = [t.get("name") for t in (res.structured_content or {}).get("tools", [])]
                    expect(not any(n.startswith("text__") for n in names), f"found {names}")
                    res = await client.call_tool("call_tool", {"name": "text__wordcount", "arguments": {"text": "a b"}})
                    expect(res.is_error is True, f"is_error={res.is_error}, content={res.content!r}")
                    expect("Unknown tool" in result_text(res), f"{result_text(res)!r}")
    except Exception as e:  # noqa: BLE001 - setup failed; its checks did not run
        R.fail("[search] setup", describe(e))
    finally:
        session_logger.setLevel(logging.NOTSET)
        await gw.http.delete(f"{gw.base}/api/v1/agents/{agent}", headers=gw.admin)


async def run_index_mode(gw: Gateway) -> None:
    """An agent in `discovery: index`, granted `weather` and `search`: in every connect
    mode, tools/list is exactly the three meta-tools; the index is in search_tools' description
    as the SDK gives it to the model (one line per visible tool, beginning with its name, no
    ungranted tool); load_tools returns two named tools' full definitions and answers an
    ungranted name exactly as a missing one; one loaded tool is called directly, the other
    through call_tool."""
    agent = f"indexer-{os.getpid()}"
    async with check(f"[index] admin API creates agent {agent} (discovery: index) granted weather and search"):
        r = await gw.http.post(
            f"{gw.base}/api/v1/agents", headers=gw.admin, json={"name": agent, "discovery": "index"}
        )
        expect(r.status_code == 201, f"POST /api/v1/agents -> {r.status_code} {r.text}")
        await gw.add_grant(agent, "weather")
        await gw.add_grant(agent, "search")
    visible = ["search__get", "search__query", "weather__current", "weather__forecast"]
    session_logger = logging.getLogger("client")
    session_logger.setLevel(logging.ERROR)
    try:
        token = await gw.token(await gw.create_client(agent))
        for mode in MODES:
            tag = f"[index/{mode}]"
            async with connect(gw.mcp_url, mode, token) as client:
                async with check(f"{tag} lists exactly [call_tool, load_tools, search_tools]"):
                    await expect_tools(client, ["call_tool", "load_tools", "search_tools"])
                async with check(f"{tag} search_tools' description indexes each visible tool on a line of its own"):
                    tools = (await client.list_tools()).tools
                    search = next(t for t in tools if t.name == "search_tools")
                    lines = (search.description or "").splitlines()
                    indexed = [line.split(":")[0] for line in lines if "__" in line.split(":")[0]]
                    expect(indexed == visible, f"indexed {indexed}")
                    expect(not any(line.startswith("text__") for line in lines), "an ungranted tool is indexed")
                    # Each group under its heading: its name and its openapi.json's info.summary.
                    headings = [line for line in lines if line.startswith("## ")]
                    expect(headings == ["## search: The team's notes: onboarding, runbooks, postmortems",
                                        "## weather: Weather now and forecasts for a dozen cities"],
                           f"headings {headings}")
                async with check(f"{tag} load_tools {{names: [weather__current, search__query, text__wordcount, nope__x]}}"):
                    res = await client.call_tool(
                        "load_tools",
                        {"names": ["weather__current", "search__query", "text__wordcount", "nope__x"]},
                    )
                    expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")
                    sc = res.structured_content or {}
                    names = [t.get("name") for t in sc.get("tools", [])]
                    expect(names == ["weather__current", "search__query"], f"loaded {names}")
                    expect(all("inputSchema" in t for t in sc["tools"]), "a definition has no inputSchema")
                    expect(sc.get("not_found") == ["text__wordcount", "nope__x"], f"not_found {sc.get('not_found')}")
                    expect(json.loads(result_text(res)) == sc, "the text content is not the structuredContent JSON")
                async with check(f"{tag} calls the loaded weather__current directly by name"):
                    res = await client.call_tool("weather__current", {"city": "Paris"})
                    expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")
                    expect((res.structured_content or {}).get("city") == "Paris", f"{res.structured_content!r}")
                async with check(f"{tag} call_tool {{name: search__query, arguments: {{q: deploy rollback}}}}"):
                    res = await client.call_tool(
                        "call_tool", {"name": "search__query", "arguments": {"q": "deploy rollback"}}
                    )
                    expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")
    except Exception as e:  # noqa: BLE001 - setup failed; its checks did not run
        R.fail("[index] setup", describe(e))
    finally:
        session_logger.setLevel(logging.NOTSET)
        await gw.http.delete(f"{gw.base}/api/v1/agents/{agent}", headers=gw.admin)


async def run_argument_rules(gw: Gateway, mode: str, meteo: dict[str, str]) -> None:
    """A grant narrowed to `days <= 3`: the SDK lists the narrowed schema, and a call outside it
    is a tool error naming the parameter and the rule."""
    tag = f"[{mode}]"
    async with check(f"{tag} admin API narrows meteo's weather__forecast to days <= 3"):
        body = await gw.set_rules("meteo", "weather__forecast", {"days": {"maximum": 3}})
        expect(body.get("problems") == [], f"unexpected problems: {body}")
    try:
        token = await gw.token(meteo)
        async with connect(gw.mcp_url, mode, token) as client:
            async with check(f"{tag} meteo's tools/list shows days with maximum 3, required"):
                tools = (await client.list_tools()).tools
                forecast = next(t for t in tools if t.name == "weather__forecast")
                days = forecast.input_schema["properties"]["days"]
                expect(days.get("maximum") == 3, f"days schema is {days}")
                expect("days" in forecast.input_schema.get("required", []), f"required is {forecast.input_schema.get('required')}")
            async with check(f"{tag} weather__forecast {{days: 2}} runs"):
                res = await client.call_tool("weather__forecast", {"city": "Paris", "days": 2})
                expect(res.is_error is False, f"is_error={res.is_error}, content={res.content!r}")
            async with check(f"{tag} weather__forecast {{days: 5}} is refused, naming days and the rule"):
                res = await client.call_tool("weather__forecast", {"city": "Paris", "days": 5})
                text = result_text(res)
                expect(res.is_error is True, f"is_error={res.is_error}, content={res.content!r}")
                expect("`days`" in text and '{"maximum":3}' in text, f"error text does not name the rule: {text!r}")
    finally:
        await gw.delete_rules("meteo", "weather__forecast")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

