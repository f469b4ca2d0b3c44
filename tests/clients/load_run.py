"""A small load run against a live gateway, as an agent would make it: successes, tool errors,
calls refused by an argument rule, calls to a tool the agent is not granted, and a burst past
its rate limit. What follows it (the SIEM check, Prometheus's queries) reads what it left.

Env: TOOLGATE_URL, TOOLGATE_ADMIN_TOKEN (a gateway serving ./tools and ./policies).
Standard library only.
"""

import base64
import collections
import concurrent.futures
import json
import os
import urllib.error
import urllib.parse
import urllib.request

URL = os.environ["TOOLGATE_URL"]
ADMIN = {"Authorization": f"Bearer {os.environ['TOOLGATE_ADMIN_TOKEN']}"}


def http(method, path, body=None, headers=None, form=None):
    data = None
    h = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        h["content-type"] = "application/json"
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        h["content-type"] = "application/x-www-form-urlencoded"
    req = urllib.request.Request(URL + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def main():
    status, text = http("PUT", "/api/v1/agents/meteo/arguments/weather__forecast",
                        {"days": {"maximum": 3}}, ADMIN)
    assert status == 200, text
    status, text = http("POST", "/api/v1/agents/meteo/clients", {}, ADMIN)
    assert status in (200, 201), text
    cred = json.loads(text)
    basic = base64.b64encode(f"{cred['client_id']}:{cred['client_secret']}".encode()).decode()
    status, text = http("POST", "/oauth/token", headers={"Authorization": f"Basic {basic}"},
                        form={"grant_type": "client_credentials", "resource": URL + "/mcp"})
    assert status == 200, text
    bearer = {"Authorization": f"Bearer {json.loads(text)['access_token']}"}
    # The weather operations are GETs (arguments in the query), search's a POST.
    mix = [
        ("GET", "/tools/weather/current?city=Paris", None),
        ("GET", "/tools/weather/current?city=Atlantis", None),  # a tool error
        ("GET", "/tools/weather/forecast?city=Paris&days=7", None),  # refused by the rule
        ("GET", "/tools/weather/forecast?city=Paris&days=2", None),
        ("POST", "/tools/search/query", {"q": "deploy"}),  # not granted to meteo
    ]
    seen = collections.Counter()
    for i in range(10):
        method, route, body = mix[i % len(mix)]
        status, _ = http(method, route, body, bearer)
        seen[(route, status)] += 1
    # A burst past meteo's limit (5/s, burst 10): sent at once, so that it is one however slow
    # each call is on a busy machine (one by one, a slow script lets the bucket refill).
    burst = "/tools/weather/current?city=Paris"
    with concurrent.futures.ThreadPoolExecutor(max_workers=30) as pool:
        for status, _ in pool.map(lambda _: http("GET", burst, None, bearer), range(30)):
            seen[(burst, status)] += 1
    for (route, status), n in sorted(seen.items()):
        print(f"{n:3d} x {status} {route}")
    statuses = {s for (_, s) in seen}
    for want in (200, 400, 404, 429):
        assert want in statuses, f"no {want} in the load run: {dict(seen)}"


if __name__ == "__main__":
    main()
