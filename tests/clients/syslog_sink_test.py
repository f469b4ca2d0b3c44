"""rsyslog (Debian's package) receives every audit row through `--audit-sink syslog+tcp://` or
`syslog+tls://`, with rsyslog stopped and started again in the middle of a stream of calls: every
row the log holds arrives (duplicates allowed: each message carries its row id), none missing.

Env: TOOLGATE_URL, TOOLGATE_ADMIN_TOKEN (a gateway started with the sink), RSYSLOG_CONF,
RSYSLOG_OUT (the file rsyslog writes), RSYSLOG_PID, SYSLOG_FORMAT (`cef`, the default, or
`ocsf`: the sink's `?format=`; each message is then one OCSF record whose `metadata.uid` is the
row id).
Standard library only.
"""

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

URL = os.environ["TOOLGATE_URL"]
ADMIN = os.environ["TOOLGATE_ADMIN_TOKEN"]
CONF = os.environ["RSYSLOG_CONF"]
OUT = os.environ["RSYSLOG_OUT"]
PIDFILE = os.environ["RSYSLOG_PID"]
FORMAT = os.environ.get("SYSLOG_FORMAT", "cef")


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
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def rsyslog_start():
    subprocess.run(["rsyslogd", "-f", CONF, "-i", PIDFILE], check=True)
    # Ready when it listens: the sink connects on its own schedule anyway.
    time.sleep(0.2)


def rsyslog_stop():
    pid = int(open(PIDFILE).read().strip())
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    sys.exit("rsyslog did not stop")


def received_ids():
    try:
        text = open(OUT, encoding="utf-8", errors="replace").read()
    except FileNotFoundError:
        return set()
    if FORMAT == "cef":
        return {int(m) for m in re.findall(r"externalId=(\d+)", text)}
    ids = set()
    for line in text.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue  # a message rsyslog cut or a partial last line: the row comes again or fails
        ids.add(int(record["metadata"]["uid"]))
    return ids


def main():
    admin = {"Authorization": f"Bearer {ADMIN}"}
    cred = json.loads(http("POST", "/api/v1/agents/assistant/clients", {}, admin))
    basic = base64.b64encode(f"{cred['client_id']}:{cred['client_secret']}".encode()).decode()
    token = json.loads(http("POST", "/oauth/token", headers={"Authorization": f"Basic {basic}"},
                            form={"grant_type": "client_credentials", "resource": URL + "/mcp"}))["access_token"]
    bearer = {"Authorization": f"Bearer {token}"}

    def calls(n):
        for i in range(n):
            http("POST", "/tools/search/query", {"q": f"deploy {i}", "limit": 1}, bearer)

    rsyslog_start()
    calls(30)
    rsyslog_stop()
    t = time.monotonic()
    calls(30)  # rsyslog is down: calls go on, the sink's lag grows
    print(f"30 calls with rsyslog down took {time.monotonic() - t:.2f} s")
    rsyslog_start()
    calls(30)
    export = http("GET", "/api/v1/audit/export?format=jsonl", headers=admin)
    want = {json.loads(l)["id"] for l in export.splitlines() if l.startswith('{"format"')}
    deadline = time.monotonic() + 90
    while True:
        got = received_ids()
        missing = want - got
        if not missing:
            break
        if time.monotonic() > deadline:
            sys.exit(f"rsyslog never received {len(missing)} of {len(want)} rows: {sorted(missing)[:20]}")
        time.sleep(0.2)
    lines = open(OUT, encoding="utf-8").read().count("\n")
    print(f"rsyslog received all {len(want)} rows as {FORMAT} ({lines} messages, {lines - len(got)} duplicates) "
          "through a restart in the middle")
    metrics = http("GET", "/metrics")
    errors = [l for l in metrics.splitlines() if l.startswith("toolgate_audit_sink_errors_total")]
    print("sink errors while rsyslog was down:", errors)
    assert errors and any(not l.endswith(" 0") for l in errors), "the outage was never seen"
    rsyslog_stop()


if __name__ == "__main__":
    main()
