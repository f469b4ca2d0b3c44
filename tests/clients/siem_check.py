"""The audit log as a SIEM receives it, from a live gateway: every OCSF record validates
against the OCSF 1.8.0 JSON Schema (made by ocsf-json-schema from the schema it packages,
checked with jsonschema), the chain re-verifies from the OCSF records alone, a record edited
in transit is caught, and CEF and JSONL carry the same rows.

Env: TOOLGATE_URL, TOOLGATE_ADMIN_TOKEN. Run after other clients have used the gateway, so the
log holds tool calls, listings, token issuance, sign-ins and admin changes.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import jsonschema
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

URL = os.environ["TOOLGATE_URL"]
TOKEN = os.environ["TOOLGATE_ADMIN_TOKEN"]
HERE = os.path.dirname(os.path.abspath(__file__))
VERIFY = os.path.join(HERE, "..", "..", "scripts", "verify_ocsf_chain.py")


def export(fmt, query=""):
    req = urllib.request.Request(
        f"{URL}/api/v1/audit/export?format={fmt}{query}",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def main():
    ocsf_text = export("ocsf")
    records = [json.loads(line) for line in ocsf_text.splitlines() if line.strip()]
    assert records, "the export is empty"
    schema = OcsfJsonSchemaEmbedded(get_ocsf_schema(version="1.8.0"))
    validators = {}
    classes = {}
    for i, rec in enumerate(records):
        name = schema.lookup_class_name_from_uid(class_uid=rec["class_uid"])
        if name not in validators:
            s = schema.get_class_schema(class_name=name, profiles=rec["metadata"]["profiles"])
            validators[name] = jsonschema.Draft202012Validator(s)
        errors = sorted(validators[name].iter_errors(rec), key=lambda e: list(e.path))
        if errors:
            for e in errors[:5]:
                print(f"record {i} ({name}, {rec['unmapped']['toolgate']['event_type']}): "
                      f"{'/'.join(map(str, e.path))}: {e.message}")
            sys.exit(f"record {i} does not validate against OCSF 1.8.0 {name}")
        assert rec["metadata"]["version"] == "1.8.0"
        classes.setdefault(name, set()).add(rec["unmapped"]["toolgate"]["event_type"])
    for want in ("api_activity", "authentication", "entity_management"):
        assert want in classes, f"no {want} record among {sorted(classes)}"
    print(f"{len(records)} OCSF records validate against OCSF 1.8.0:")
    for name, kinds in sorted(classes.items()):
        print(f"  {name}: {', '.join(sorted(kinds))}")

    with tempfile.TemporaryDirectory() as d:
        good = os.path.join(d, "good.ocsf.jsonl")
        with open(good, "w") as f:
            f.write(ocsf_text)
        r = subprocess.run([sys.executable, VERIFY, good], capture_output=True, text=True)
        print(r.stdout.strip().splitlines()[-1])
        assert r.returncode == 0, r.stdout + r.stderr
        # In transit, someone rewrites a denial as a success, or drops a record.
        lines = ocsf_text.splitlines()
        idx = next(i for i, l in enumerate(lines) if '"outcome":"success"' in l)
        edited = list(lines)
        edited[idx] = edited[idx].replace('"outcome":"success"', '"outcome":"denied"', 1)
        bad = os.path.join(d, "edited.ocsf.jsonl")
        with open(bad, "w") as f:
            f.write("\n".join(edited))
        r = subprocess.run([sys.executable, VERIFY, bad], capture_output=True, text=True)
        assert r.returncode == 1 and "edited" in r.stdout, r.stdout
        # A record from the middle of a chain.
        by_chain = {}
        for i, rec in enumerate(records):
            by_chain.setdefault(rec["unmapped"]["record_integrity"]["chain_uid"], []).append(i)
        longest = max(by_chain.values(), key=len)
        assert len(longest) >= 3, "a chain of at least three records"
        dropped = [l for i, l in enumerate(lines) if i != longest[1]]
        cut = os.path.join(d, "dropped.ocsf.jsonl")
        with open(cut, "w") as f:
            f.write("\n".join(dropped))
        r = subprocess.run([sys.executable, VERIFY, cut], capture_output=True, text=True)
        assert r.returncode == 1 and "records missing" in r.stdout, r.stdout
    print("the chain re-verifies from OCSF alone; an edited record and a dropped one are caught")

    # CEF and JSONL: the same rows, by id.
    cef = [l for l in export("cef").splitlines() if l]
    jsonl = [json.loads(l) for l in export("jsonl").splitlines() if l]
    rows = [r for r in jsonl if "format" in r]
    cef_ids = {int(l.split("externalId=")[1].split(" ")[0]) for l in cef}
    row_ids = {r["id"] for r in rows}
    ocsf_ids = {int(r["metadata"]["uid"]) for r in records}
    assert ocsf_ids <= row_ids and ocsf_ids <= cef_ids, "CEF and JSONL carry the OCSF rows"
    for r in rows:
        assert all(k in r for k in ("person", "flags", "client_id", "severity", "category")), r
    print(f"CEF ({len(cef)} lines) and JSONL ({len(rows)} rows) carry the same rows")


if __name__ == "__main__":
    main()
