"""Client-credentials tokens for toolgate that renew themselves, as an httpx `Auth`.

Copy this class into an agent that talks to toolgate with an httpx-based MCP client (the
official Python SDK, the OpenAI Agents SDK, LangChain's MCP adapters). It asks toolgate's
token endpoint for a token, reuses it until shortly before it expires, asks again then, and
asks once more if a request is answered 401 anyway (a revoked token, a clock that drifted).
It never loops: a second 401 in a row, or a refused token request (a deleted client), is an
error that says so.

    auth = ClientCredentials("https://toolgate.example.com", client_id, client_secret)
    async with httpx.AsyncClient(auth=auth) as http: ...

`httpx` here is whichever the client library uses (`httpx` or `httpx2`): pass its module.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Generator


class TokenRefused(Exception):
    """The token endpoint refused the client's credentials: retrying will not help."""


def client_credentials_auth(httpx: Any) -> type:
    """The `Auth` class for the httpx module `httpx` (the SDKs use different forks)."""

    class ClientCredentials(httpx.Auth):
        requires_response_body = True

        def __init__(
            self,
            base_url: str,
            client_id: str,
            client_secret: str,
            scope: str | None = None,
            margin_secs: float = 1.0,
        ) -> None:
            base = base_url.rstrip("/")
            self.token_url = f"{base}/oauth/token"
            self.resource = f"{base}/mcp"
            basic = base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
            self.basic = f"Basic {basic}"
            self.scope = scope
            self.margin = margin_secs
            self.token: str | None = None
            self.expires_at = 0.0
            self.fetched = 0

        def _token_request(self) -> Any:
            form = {"grant_type": "client_credentials", "resource": self.resource}
            if self.scope:
                form["scope"] = self.scope
            return httpx.Request("POST", self.token_url, data=form, headers={"Authorization": self.basic})

        def _take(self, response: Any) -> None:
            if response.status_code != 200:
                raise TokenRefused(f"toolgate refused the client credentials: {response.status_code} {response.text}")
            body = json.loads(response.content)
            self.token = body["access_token"]
            self.expires_at = time.time() + float(body.get("expires_in", 60))
            self.fetched += 1

        def auth_flow(self, request: Any) -> Generator[Any, Any, None]:
            if self.token is None or time.time() >= self.expires_at - self.margin:
                self._take((yield self._token_request()))
            request.headers["Authorization"] = f"Bearer {self.token}"
            response = yield request
            if response.status_code == 401:
                # Expired early, or revoked: one new token, one retry, never more.
                self._take((yield self._token_request()))
                request.headers["Authorization"] = f"Bearer {self.token}"
                yield request

    return ClientCredentials
