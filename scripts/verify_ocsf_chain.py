#!/usr/bin/env python3
"""Re-verify toolgate's audit hash chains from OCSF records alone, as a SIEM would.

Usage: verify_ocsf_chain.py FILE.ocsf.jsonl [...]   (or - for stdin)

Each record carries, in `unmapped.record_integrity`, its chain, sequence number, the previous
record's hash and its own; and in `unmapped.toolgate` the stored fields the hash is computed
over (`toolgate-chain-v1`): sha256(prev_hash + "\\n" + canonical), where canonical is the
compact JSON array of the fields below, `flags` appended when present, then
{"person": ...} when present. Checks every record's hash, that consecutive records of a
chain link, and names the sequence numbers missing between the first and last record of each
chain. Standard library only. Exit 0 when everything holds, 1 otherwise.
"""

import hashlib
import json
import sys

FIELDS = [
    "event_type", "outcome", "agent", "client_id", "jti", "admin_user", "tool", "resource",
    "remote_addr", "user_agent", "request_id", "call_id", "exit_code", "error", "latency_us",
    "bytes_in", "bytes_out", "arguments", "result_sha256", "result", "details",
]
GENESIS = "0" * 64


def canonical(t):
    fields = [t["chain"], t["chain_seq"], t["instance"], t["at_unix_us"]]
    fields += [t.get(f) for f in FIELDS]
    if t.get("flags") is not None:
        fields.append(t["flags"])
    if t.get("person") is not None:
        fields.append({"person": t["person"]})
    # The bytes serde_json writes: compact, UTF-8 as is, control characters escaped.
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def link(prev, canon):
    return hashlib.sha256(prev.encode() + b"\n" + canon.encode()).hexdigest()


def main(paths):
    chains = {}
    problems = []
    records = 0
    for path in paths:
        stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
        with stream:
            for n, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                rec = json.loads(line)
                records += 1
                integ = rec["unmapped"]["record_integrity"]
                t = rec["unmapped"]["toolgate"]
                where = f"{path}:{n} (chain {integ['chain_uid']} seq {integ['sequence']})"
                if (t["chain"], t["chain_seq"]) != (integ["chain_uid"], integ["sequence"]):
                    problems.append(f"{where}: record_integrity and the stored row disagree")
                prev = integ["prev_event"]["fingerprint"]["value"]
                want = integ["fingerprint"]["value"]
                got = link(prev, canonical(t))
                if got != want:
                    problems.append(f"{where}: the hash does not match the record: edited")
                chains.setdefault(integ["chain_uid"], {})[integ["sequence"]] = (prev, want)
    for chain, rows in sorted(chains.items()):
        seqs = sorted(rows)
        first, last = seqs[0], seqs[-1]
        if first == 1 and rows[1][0] != GENESIS:
            problems.append(f"chain {chain}: its first record does not start from the genesis hash")
        missing = []
        for a, b in zip(seqs, seqs[1:]):
            if b != a + 1:
                missing.append(f"{a + 1}" if b == a + 2 else f"{a + 1} to {b - 1}")
            elif rows[b][0] != rows[a][1]:
                problems.append(f"chain {chain}: seq {b} does not link to seq {a}")
        if missing:
            problems.append(f"chain {chain}: records missing: {', '.join(missing)}")
        start = "from its start" if first == 1 else f"from seq {first} (earlier records in an earlier pull)"
        print(f"chain {chain}: {len(seqs)} records, seq {first} to {last}, {start}")
    for p in problems:
        print("BROKEN:", p)
    print(f"{records} records in {len(chains)} chains: {'intact' if not problems else 'BROKEN'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["-"]))
