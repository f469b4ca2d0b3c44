#!/usr/bin/env python3
"""What the schemas cannot see in the deployment files, checked by .ci/deploy.sh.

    python deploy_checks.py compose CONFIG_YAML    # the output of `docker-compose config`
    python deploy_checks.py kubernetes             # deploy/kubernetes/*.yaml

Each check prints one PASS/FAIL line; the last line is `N passed, N failed`, and the exit
status is 1 if any failed. Needs PyYAML (both CI venvs have it).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
passed: list[str] = []
failed: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    if ok:
        passed.append(name)
        print(f"PASS  {name}")
    else:
        failed.append(name)
        print(f"FAIL  {name}\n      {detail}")


def readme_resource() -> str:
    """The `resource` the README's quickstart requests a token for."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"-d resource=(\S+)", text)
    if not m:
        sys.exit("README.md: no `-d resource=...` in the quickstart")
    resource = m.group(1)
    # The quickstart sets the public URL once (`BASE=...`) and requests `$BASE/mcp`.
    base = re.search(r"\bBASE=(\S+)", text)
    if "$BASE" in resource:
        if not base:
            sys.exit("README.md: the quickstart's resource uses $BASE but never sets it")
        resource = resource.replace("$BASE", base.group(1))
    return resource


def compose(config_path: str) -> None:
    cfg = yaml.safe_load(open(config_path, encoding="utf-8"))
    services = cfg["services"]
    resource = readme_resource()
    instances = {n: s for n, s in services.items() if "TOOLGATE_PUBLIC_URL" in (s.get("environment") or {})}
    check("compose: two toolgate instances", len(instances) >= 2, f"instances: {sorted(instances)}")
    urls = {n: s["environment"]["TOOLGATE_PUBLIC_URL"].rstrip("/") for n, s in instances.items()}
    check(
        f"compose: every instance's public URL + /mcp is the README quickstart's resource ({resource})",
        all(u + "/mcp" == resource for u in urls.values()),
        f"public URLs: {urls}",
    )
    check(
        "compose: every instance has the same Redis and database",
        len({s["environment"].get("TOOLGATE_REDIS_URL") for s in instances.values()}) == 1
        and len({s["environment"].get("DATABASE_URL") for s in instances.values()}) == 1
        and all(s["environment"].get("TOOLGATE_REDIS_URL") for s in instances.values()),
        str({n: s["environment"] for n, s in instances.items()}),
    )
    port = re.match(r"https?://[^/:]+:(\d+)", resource)

    def published(p: object) -> str:
        if isinstance(p, dict):
            return str(p.get("published"))
        parts = str(p).split("/")[0].split(":")
        return parts[-2] if len(parts) >= 2 else parts[0]

    lb = [n for n, s in services.items() if port and any(published(p) == port.group(1) for p in s.get("ports", []))]
    check(
        "compose: the quickstart's port is published by the balancer, not by an instance",
        bool(lb) and not (set(lb) & set(instances)),
        f"published: { {n: s.get('ports') for n, s in services.items() if s.get('ports')} }",
    )
    migrate = [n for n, s in services.items() if s.get("command") == ["migrate"]]
    check("compose: a one-shot migration service", len(migrate) == 1, f"services: {sorted(services)}")

    def after_migration(name: str, seen: frozenset[str] = frozenset()) -> bool:
        for dep, cond in (services[name].get("depends_on") or {}).items():
            if dep in migrate and cond.get("condition") == "service_completed_successfully":
                return True
            if dep not in seen and dep in services and after_migration(dep, seen | {name}):
                return True
        return False

    check(
        "compose: every instance starts after the migration completed",
        bool(migrate) and all(after_migration(n) for n in instances),
        str({n: s.get("depends_on") for n, s in instances.items()}),
    )
    keygen = [n for n, s in services.items() if "audit keygen" in " ".join(s.get("command") or [])]
    key_paths = {n: s["environment"].get("TOOLGATE_AUDIT_CHECKPOINT_KEY") for n, s in instances.items()}

    def key_mounted(n: str) -> bool:
        path = key_paths[n]
        if not path or not keygen:
            return False
        gen_vols = {str(v).split(":")[0] if not isinstance(v, dict) else v.get("source") for v in services[keygen[0]].get("volumes", [])}
        for v in services[n].get("volumes", []):
            source, target = (v.get("source"), v.get("target")) if isinstance(v, dict) else str(v).split(":")[:2]
            if source in gen_vols and path.startswith(target.rstrip("/") + "/"):
                return True
        return False

    check(
        "compose: every instance signs checkpoints with the key the keygen service writes, after it ran",
        len(keygen) == 1
        and all(key_mounted(n) for n in instances)
        and all(
            any(d == keygen[0] and c.get("condition") == "service_completed_successfully" for d, c in (services[n].get("depends_on") or {}).items())
            or after_migration(n)  # toolgate-b waits for toolgate-a, which waited for the key
            for n in instances
        ),
        f"keygen services {keygen}, key paths {key_paths}",
    )
    grace = {n: s.get("stop_grace_period") for n, s in instances.items()}
    drain = {n: s["environment"].get("TOOLGATE_DRAIN_TIMEOUT_SECS") for n, s in instances.items()}

    def secs(v: str | None) -> int:
        m = re.fullmatch(r"(\d+)s?", str(v or ""))
        return int(m.group(1)) if m else 0

    check(
        "compose: stop_grace_period is longer than the drain timeout",
        all(secs(grace[n]) > secs(drain[n]) > 0 for n in instances),
        f"stop_grace_period {grace}, drain {drain}",
    )


def kubernetes() -> None:
    kdir = os.path.join(ROOT, "deploy", "kubernetes")
    docs = {}
    for f in sorted(os.listdir(kdir)):
        if f.endswith(".yaml") and f != "kustomization.yaml":
            for d in yaml.safe_load_all(open(os.path.join(kdir, f), encoding="utf-8")):
                docs[(d["kind"], d["metadata"]["name"])] = d
    kust = yaml.safe_load(open(os.path.join(kdir, "kustomization.yaml"), encoding="utf-8"))
    check(
        "kubernetes: kustomization lists files that exist",
        all(os.path.exists(os.path.join(kdir, r)) for r in kust["resources"]),
        str(kust["resources"]),
    )
    dep = docs[("Deployment", "toolgate")]
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    c = next(x for x in pod["containers"] if x["name"] == "toolgate")
    check("kubernetes: at least 2 replicas", spec.get("replicas", 1) >= 2, f"replicas: {spec.get('replicas')}")
    check("kubernetes: readiness on /readyz", c["readinessProbe"]["httpGet"]["path"] == "/readyz", str(c["readinessProbe"]))
    check("kubernetes: liveness on /healthz", c["livenessProbe"]["httpGet"]["path"] == "/healthz", str(c["livenessProbe"]))
    check(
        "kubernetes: every container has requests and limits",
        all(x.get("resources", {}).get(k) for x in pod["containers"] + pod.get("initContainers", []) for k in ("requests", "limits")),
        "",
    )
    check(
        "kubernetes: non-root, read-only root filesystem, no privilege escalation",
        pod["securityContext"].get("runAsNonRoot") is True
        and all(
            x["securityContext"].get("readOnlyRootFilesystem") is True
            and x["securityContext"].get("allowPrivilegeEscalation") is False
            for x in pod["containers"] + pod.get("initContainers", [])
        ),
        "",
    )
    cfg = docs[("ConfigMap", "toolgate-config")]["data"]
    drain = int(cfg["TOOLGATE_DRAIN_TIMEOUT_SECS"])
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    pause = int(pre[1]) if pre[0] == "sleep" else 0
    grace = pod["terminationGracePeriodSeconds"]
    check(
        f"kubernetes: terminationGracePeriodSeconds ({grace}) > preStop pause ({pause}) + drain timeout ({drain})",
        grace > pause + drain,
        "",
    )
    labels = spec["template"]["metadata"]["labels"]
    for kind, name in (("Service", "toolgate"), ("PodDisruptionBudget", "toolgate")):
        d = docs[(kind, name)]["spec"]
        sel = d["selector"].get("matchLabels", d["selector"])
        check(f"kubernetes: the {kind} selects the Deployment's pods", all(labels.get(k) == v for k, v in sel.items()), str(sel))
    pdb = docs[("PodDisruptionBudget", "toolgate")]["spec"]
    check("kubernetes: the PDB leaves at least one replica", 1 <= pdb.get("minAvailable", 0) < spec["replicas"], str(pdb))
    env_from_secret = {
        e["valueFrom"]["secretKeyRef"]["key"]
        for x in pod["containers"] + [docs[("Job", "toolgate-migrate")]["spec"]["template"]["spec"]["containers"][0]]
        for e in x.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    secret_keys = set(docs[("Secret", "toolgate")]["stringData"])
    # The migrate Job grants the serving role: the role `serve` connects as.
    job = docs[("Job", "toolgate-migrate")]["spec"]["template"]["spec"]["containers"][0]
    job_args = job.get("args", [])
    serving = job_args[job_args.index("--serving-role") + 1] if "--serving-role" in job_args else None
    app_url = docs[("Secret", "toolgate")]["stringData"]["database-url"]
    app_role = re.match(r"postgres(?:ql)?://([^:@/]+)", app_url)
    check(
        "kubernetes: the migrate Job runs `migrate --serving-role` for the role the Deployment connects as",
        job_args[:1] == ["migrate"] and serving is not None and app_role is not None and serving == app_role.group(1),
        f"args {job_args}, database-url user {app_role.group(1) if app_role else None}",
    )
    key_env = next((e.get("value") for e in c.get("env", []) if e["name"] == "TOOLGATE_AUDIT_CHECKPOINT_KEY"), None)
    key_mount = next((m for m in c.get("volumeMounts", []) if key_env and key_env.startswith(m["mountPath"].rstrip("/") + "/")), None)
    key_volume = next((v for v in pod.get("volumes", []) if key_mount and v["name"] == key_mount["name"]), None)
    key_items = (key_volume or {}).get("secret", {}).get("items", [])
    check(
        "kubernetes: the checkpoint key is a Secret key mounted read-only where TOOLGATE_AUDIT_CHECKPOINT_KEY points",
        key_volume is not None
        and key_mount.get("readOnly") is True
        and key_volume["secret"]["secretName"] == "toolgate"
        and any(i["key"] in secret_keys and key_env == key_mount["mountPath"].rstrip("/") + "/" + i["path"] for i in key_items),
        f"env {key_env}, mount {key_mount}, volume {key_volume}",
    )
    ing = docs.get(("Ingress", "toolgate"))
    svc = docs[("Service", "toolgate")]["spec"]
    backends = [p["backend"]["service"] for r in (ing or {}).get("spec", {}).get("rules", []) for p in r["http"]["paths"]]
    public_host = re.match(r"https://([^/:]+)", cfg["TOOLGATE_PUBLIC_URL"])
    check(
        "kubernetes: the Ingress serves the public URL's host over TLS to the Service's port, unbuffered",
        ing is not None
        and public_host is not None
        and [r["host"] for r in ing["spec"]["rules"]] == [public_host.group(1)]
        and any(public_host.group(1) in t.get("hosts", []) for t in ing["spec"].get("tls", []))
        and backends
        and all(b["name"] == "toolgate" and b["port"].get("name") in {p.get("name") for p in svc["ports"]} for b in backends)
        and ing["metadata"].get("annotations", {}).get("nginx.ingress.kubernetes.io/proxy-buffering") == "off",
        str(ing),
    )
    check("kubernetes: every Secret key used is in the template", env_from_secret <= secret_keys, f"{env_from_secret - secret_keys}")
    check(
        "kubernetes: the Secret template holds no real secret",
        all("REPLACE-ME" in v for v in docs[("Secret", "toolgate")]["stringData"].values()),
        "",
    )
    check(
        "kubernetes: the public URL is https and has no path",
        re.fullmatch(r"https://[^/]+", cfg["TOOLGATE_PUBLIC_URL"]) is not None,
        cfg["TOOLGATE_PUBLIC_URL"],
    )

    # The layout init container, run as the kubelet would: each ConfigMap key a file in the
    # mounted folder, then its script; the result must be tools/ and policies/ as in git.
    folders = docs[("ConfigMap", "toolgate-folders")]
    init = next(x for x in pod["initContainers"] if x["name"] == "layout")
    script = init["command"][-1]
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "folders"), os.path.join(tmp, "layout")
        os.makedirs(src)
        os.makedirs(out)
        for k, v in (folders.get("data") or {}).items():
            with open(os.path.join(src, k), "w", encoding="utf-8") as f:
                f.write(v)
        script = script.replace("/etc/toolgate/folders", src).replace("/layout", out)
        r = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
        check("kubernetes: the layout init container's script runs", r.returncode == 0, r.stderr)
        diffs = []
        for folder in ("tools", "policies"):
            for d, dirs, files in os.walk(os.path.join(ROOT, folder)):
                dirs[:] = [x for x in dirs if x not in ("__pycache__", "node_modules")]
                for f in files:
                    if f.endswith(".pyc"):
                        continue
                    p = os.path.join(d, f)
                    rel = os.path.relpath(p, ROOT)
                    q = os.path.join(out, rel)
                    if not os.path.exists(q):
                        diffs.append(f"{rel}: missing")
                        continue
                    if open(p, "rb").read() != open(q, "rb").read():
                        diffs.append(f"{rel}: content differs")
                    if bool(os.stat(p).st_mode & stat.S_IXUSR) != bool(os.stat(q).st_mode & stat.S_IXUSR):
                        diffs.append(f"{rel}: executable bit differs")
        check("kubernetes: the layout rebuilds tools/ and policies/ exactly (content and executable bits)", not diffs, "; ".join(diffs[:10]))
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    if sys.argv[1:2] == ["compose"] and len(sys.argv) == 3:
        compose(sys.argv[2])
    elif sys.argv[1:] == ["kubernetes"]:
        kubernetes()
    else:
        sys.exit(__doc__)
    print(f"{len(passed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
