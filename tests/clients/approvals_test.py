#!/usr/bin/env python3
"""Approvals through the official Python MCP SDK, in both eras, and over REST.

    TOOLGATE_URL=http://127.0.0.1:8787 TOOLGATE_ADMIN_TOKEN=xyz python tests/clients/approvals_test.py

Agent `approval-watcher` is granted `weather` and needs approval for `weather__forecast` when
`days` is above 3 (approvers: admin). A call under the threshold runs at once in both eras.
2025-11-25: one above it is answered with a tool error saying it waits, with the request in
`_meta`; the admin API approves it; the same call made again gets the result of the one run;
the same call once more asks anew. 2026-07-28 (no tasks extension): the one `call_tool` is held
through InputRequired rounds (the SDK comes back with the sealed requestState) and returns the
result once the admin API approves, or the approver's reason once denied. Over REST, the call answers 202 with a status URL
that answers the result once approved; a denied call is refused with the approver's reason.
The last line is `N passed, N failed`; the exit status is non-zero on any failure.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import mcp_client_test as base
from mcp_client_test import R, check, connect, expect, result_text

AGENT = "approval-watcher"
META = "io.toolgate/approval"


async def wait_for(predicate, what: str, seconds: float = 15.0) -> None:
    start = time.monotonic()
    while not await predicate():
        if time.monotonic() - start > seconds:
            raise base.CheckFailed(f"not within {seconds}s: {what}")
        await asyncio.sleep(0.1)


async def approval_state(gw: base.Gateway, approval: str) -> str:
    r = await gw.http.get(f"{gw.base}/api/v1/approvals/{approval}", headers=gw.admin)
    expect(r.status_code == 200, f"GET /api/v1/approvals/{approval} -> {r.status_code} {r.text}")
    return r.json()["approval"]["state"]


async def run(gw: base.Gateway) -> None:
    r = await gw.http.post(f"{gw.base}/api/v1/agents", headers=gw.admin, json={"name": AGENT})
    expect(r.status_code == 201, f"POST /api/v1/agents -> {r.status_code} {r.text}")
    await gw.add_grant(AGENT, "weather")
    cred = await gw.create_client(AGENT)
    async with check("admin API sets an approval rule on weather__forecast when days > 3"):
        r = await gw.http.put(
            f"{gw.base}/api/v1/agents/{AGENT}/approval/weather__forecast",
            headers=gw.admin,
            json={"when": {"days": {"exclusiveMinimum": 3}}, "approvers": ["admin"], "ttl": "10m"},
        )
        expect(r.status_code == 200, f"PUT approval -> {r.status_code} {r.text}")

    async def pending_for(days: int, seen: set[str]) -> str:
        found = ""

        async def appeared() -> bool:
            nonlocal found
            r = await gw.http.get(f"{gw.base}/api/v1/approvals?state=pending", headers=gw.admin)
            for a in r.json()["approvals"]:
                if a["agent"] == AGENT and a["id"] not in seen:
                    found = a["id"]
                    return True
            return False

        await wait_for(appeared, f"a pending request for days={days}")
        seen.add(found)
        return found

    # 2025-11-25: the call is held open for a decision, with progress notifications; one
    # approved within the hold returns its result in the same call_tool; one not decided
    # within it is answered with a tool error saying it waits (the request in `_meta`), and
    # the same call made again after approval gets the result of the one run.
    token = await gw.token(cred)
    seen: set[str] = set()
    async with connect(gw.mcp_url, "legacy", token) as client:
        tag = "[legacy]"
        async with check(f"{tag} a call under the threshold runs at once"):
            res = await client.call_tool("weather__forecast", {"city": "Paris", "days": 2})
            expect(res.is_error is False, f"is_error={res.is_error} {result_text(res)}")

        async with check(f"{tag} a call above it is held with progress notifications, and completes once approved"):
            told = asyncio.Event()
            messages: list[str] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                messages.append(message or "")
                told.set()

            call = asyncio.create_task(
                client.call_tool("weather__forecast", {"city": "Paris", "days": 4}, progress_callback=on_progress)
            )
            approval = await pending_for(4, seen)
            await asyncio.wait_for(told.wait(), 15)
            expect(f"waiting for approval {approval}" in messages[0], f"progress messages: {messages!r}")
            expect(not call.done(), "call_tool returned before anyone decided")
            r = await gw.http.post(
                f"{gw.base}/api/v1/approvals/{approval}/approve", headers=gw.admin, json={"reason": "ok"}
            )
            expect(r.status_code == 200, f"approve -> {r.status_code} {r.text}")
            res = await asyncio.wait_for(call, 60)
            expect(res.is_error is False, f"is_error={res.is_error} {result_text(res)}")
            sc = res.structured_content or {}
            expect(sc.get("days") == 4 and len(sc.get("forecast", [])) == 4, f"structuredContent={sc!r}")
            expect(await approval_state(gw, approval) == "done", "the approved call is not on record as run")

        days = 7
        approval = ""
        async with check(f"{tag} a call not decided within the hold says it waits, with the request in _meta"):
            res = await client.call_tool("weather__forecast", {"city": "Paris", "days": days})
            expect(res.is_error is True, f"is_error={res.is_error} {result_text(res)}")
            meta = (res.meta or {}).get(META) or {}
            approval = meta.get("id", "")
            expect(bool(approval) and meta.get("status") == "pending", f"_meta={res.meta!r}")
            expect(f"waiting for approval {approval}" in result_text(res), result_text(res))
            seen.add(approval)

        async with check(f"{tag} the admin API approves it and the gateway runs it once"):
            r = await gw.http.post(
                f"{gw.base}/api/v1/approvals/{approval}/approve", headers=gw.admin, json={"reason": "ok"}
            )
            expect(r.status_code == 200, f"approve -> {r.status_code} {r.text}")

            async def done() -> bool:
                return await approval_state(gw, approval) == "done"

            await wait_for(done, "the approved call ran")

        async with check(f"{tag} the same call again gets the result of that one run"):
            res = await client.call_tool("weather__forecast", {"city": "Paris", "days": days})
            expect(res.is_error is False, f"is_error={res.is_error} {result_text(res)}")
            sc = res.structured_content or {}
            expect(sc.get("days") == days and len(sc.get("forecast", [])) == days, f"structuredContent={sc!r}")

        async with check(f"{tag} once more is a new request: an approval is used once"):
            call = asyncio.create_task(client.call_tool("weather__forecast", {"city": "Paris", "days": days}))
            again = await pending_for(days, seen)
            expect(again != approval, "the used approval was offered again")
            r = await gw.http.post(
                f"{gw.base}/api/v1/approvals/{again}/deny", headers=gw.admin, json={"reason": "once is enough"}
            )
            expect(r.status_code == 200, f"deny -> {r.status_code} {r.text}")
            res = await asyncio.wait_for(call, 60)
            expect(res.is_error is True and "once is enough" in result_text(res), result_text(res))

    # 2026-07-28 without the tasks extension: InputRequiredResult with a sealed requestState;
    # the SDK comes back with it at once, the gateway holds the retry open for a decision, and
    # the one call_tool returns the result once a person approves.
    token = await gw.token(cred)
    async with connect(gw.mcp_url, "2026-07-28", token) as client:
        tag, days = "[2026-07-28]", 5
        async with check(f"{tag} a call under the threshold runs at once"):
            res = await client.call_tool("weather__forecast", {"city": "Paris", "days": 2})
            expect(res.is_error is False, f"is_error={res.is_error} {result_text(res)}")

        async with check(f"{tag} a call above it is held by InputRequired rounds, and completes once approved"):
            call = asyncio.create_task(client.call_tool("weather__forecast", {"city": "Paris", "days": days}))
            approval = await pending_for(days, seen)
            expect(not call.done(), "call_tool returned before anyone decided")
            r = await gw.http.post(
                f"{gw.base}/api/v1/approvals/{approval}/approve", headers=gw.admin, json={"reason": "ok"}
            )
            expect(r.status_code == 200, f"approve -> {r.status_code} {r.text}")
            res = await asyncio.wait_for(call, 60)
            expect(res.is_error is False, f"is_error={res.is_error} {result_text(res)}")
            sc = res.structured_content or {}
            expect(sc.get("days") == days and len(sc.get("forecast", [])) == days, f"structuredContent={sc!r}")

        async with check(f"{tag} the same call again is a new request, and a denial ends it with the reason"):
            call = asyncio.create_task(client.call_tool("weather__forecast", {"city": "Paris", "days": days}))
            again = await pending_for(days, seen)
            r = await gw.http.post(
                f"{gw.base}/api/v1/approvals/{again}/deny", headers=gw.admin, json={"reason": "once is enough"}
            )
            expect(r.status_code == 200, f"deny -> {r.status_code} {r.text}")
            res = await asyncio.wait_for(call, 60)
            expect(res.is_error is True and "once is enough" in result_text(res), result_text(res))

    token = await gw.token(cred)
    auth = {"Authorization": f"Bearer {token}"}
    async with check("[rest] 202 with a status URL, then the result there once approved"):
        url = f"{gw.base}/tools/weather/forecast"
        r = await gw.http.get(url, headers=auth, params={"city": "Tokyo", "days": 6})
        expect(r.status_code == 202, f"GET {url} -> {r.status_code} {r.text}")
        body = r.json()
        expect(body["status"] == "pending" and r.headers.get("location") == body["status_url"], f"{body} {r.headers}")
        status_url = gw.base + body["status_url"]
        r = await gw.http.get(status_url, headers=auth)
        expect(r.status_code == 202, f"status before approval -> {r.status_code} {r.text}")
        r = await gw.http.post(f"{gw.base}/api/v1/approvals/{body['approval']}/approve", headers=gw.admin)
        expect(r.status_code == 200, f"approve -> {r.status_code} {r.text}")

        async def ready() -> bool:
            return (await gw.http.get(status_url, headers=auth)).status_code == 200

        await wait_for(ready, "the status URL answers the result")
        r = await gw.http.get(status_url, headers=auth)
        expect(r.json().get("days") == 6 and len(r.json().get("forecast", [])) == 6, r.text[:300])


async def main() -> int:
    url = os.environ.get("TOOLGATE_URL", "http://127.0.0.1:8787")
    admin = os.environ.get("TOOLGATE_ADMIN_TOKEN")
    if not admin:
        print("TOOLGATE_ADMIN_TOKEN is required", file=sys.stderr)
        return 2
    print(f"toolgate approvals test against {url} (mcp SDK)", flush=True)
    gw = base.Gateway(url, admin)
    try:
        await run(gw)
    except Exception as e:  # noqa: BLE001 - setup failed; its checks did not run
        R.fail("setup", base.describe(e))
    finally:
        await gw.close()
    return base.finish()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
