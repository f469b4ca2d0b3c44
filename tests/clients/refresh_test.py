"""Runs the token-refresh recipes of examples/refresh/ (Python SDK, TypeScript SDK, and with AGENTS_PYTHON
the OpenAI Agents SDK and LangChain adapters) against a gateway issuing 5-second tokens.

    TOOLGATE_URL=... TOOLGATE_ADMIN_TOKEN=... python tests/clients/refresh_test.py

The server must run with `--token-ttl-secs 5 --token-leeway-secs 0`. For each recipe: an agent
granted `search`, a client for it, the recipe run with `--outlive-token` (a call after the
first token expired must succeed). Then the attack: the client deleted, the Auth must raise
`TokenRefused` after exactly one token request, not retry in a loop.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import httpx2

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPES = os.path.join(HERE, "..", "..", "examples", "refresh")
sys.path.insert(0, RECIPES)
from toolgate_auth import TokenRefused, client_credentials_auth  # noqa: E402

BASE = os.environ["TOOLGATE_URL"].rstrip("/")
ADMIN = {"Authorization": f"Bearer {os.environ['TOOLGATE_ADMIN_TOKEN']}"}


def agent_with_client(http: httpx2.Client) -> tuple[str, dict[str, str]]:
    name = f"refresh-{uuid.uuid4().hex[:8]}"
    r = http.post(f"{BASE}/api/v1/agents", headers=ADMIN, json={"name": name})
    assert r.status_code in (200, 201), r.text
    r = http.post(f"{BASE}/api/v1/agents/{name}/grants", headers=ADMIN, json={"target": "search"})
    assert r.status_code in (200, 201), r.text
    r = http.post(f"{BASE}/api/v1/agents/{name}/clients", headers=ADMIN, json={})
    assert r.status_code in (200, 201), r.text
    return name, r.json()


def main() -> None:
    failed = 0
    with httpx2.Client(timeout=30) as http:
        # The server's tokens really are short: the recipes must outlive one.
        _, cred = agent_with_client(http)
        r = http.post(
            f"{BASE}/oauth/token",
            auth=(cred["client_id"], cred["client_secret"]),
            data={"grant_type": "client_credentials"},
        )
        assert r.status_code == 200 and r.json()["expires_in"] <= 5, f"start the server with --token-ttl-secs 5: {r.text}"

        recipes = [(sys.executable, "python_sdk.py")]
        # The agent frameworks pin another `mcp` than the SDK test's venv: their own venv.
        agents_python = os.environ.get("AGENTS_PYTHON")
        if agents_python:
            recipes += [(agents_python, "openai_agents.py"), (agents_python, "langchain_adapters.py")]
        node = os.environ.get("NODE", "node")
        if os.path.isdir(os.path.join(RECIPES, "node_modules")):
            recipes.append((node, "typescript_sdk.mjs"))
        for runner, recipe in recipes:
            _, cred = agent_with_client(http)
            env = {**os.environ, "CLIENT_ID": cred["client_id"], "CLIENT_SECRET": cred["client_secret"]}
            t0 = time.monotonic()
            p = subprocess.run([runner, recipe, "--outlive-token"], cwd=RECIPES, env=env, capture_output=True, text=True, timeout=120)
            took = time.monotonic() - t0
            if p.returncode == 0:
                print(f"PASS  {recipe}: {p.stdout.strip().splitlines()[-1]} ({took:.1f} s)")
            else:
                failed += 1
                print(f"FAIL  {recipe} (exit {p.returncode})\n{p.stdout}\n{p.stderr}")

        # A deleted client: one token request, a clear error, no retry storm.
        _, cred = agent_with_client(http)
        r = http.delete(f"{BASE}/api/v1/clients/{cred['client_id']}", headers=ADMIN)
        assert r.status_code == 204, r.text
        auth = client_credentials_auth(httpx2)(BASE, cred["client_id"], cred["client_secret"])
        sent = []
        with httpx2.Client(auth=auth, timeout=30, event_hooks={"request": [lambda req: sent.append(req.url.path)]}) as c:
            try:
                c.post(f"{BASE}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                failed += 1
                print("FAIL  a deleted client's Auth did not raise")
            except TokenRefused as e:
                if sent.count("/oauth/token") == 1 and "/mcp" not in sent:
                    print(f"PASS  a deleted client: one token request, then TokenRefused ({str(e)[:80]})")
                else:
                    failed += 1
                    print(f"FAIL  a deleted client: requests sent {sent}")
    if failed:
        sys.exit(f"{failed} refresh check(s) failed")


if __name__ == "__main__":
    asyncio.run(asyncio.sleep(0))
    main()
