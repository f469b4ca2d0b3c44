#!/usr/bin/env bash
# Builds the crate from exactly the files the Dockerfile's build stage copies in, without a
# container engine: the COPY lines of that stage are read from the Dockerfile itself, the
# context is filtered by .dockerignore as `docker build` filters it, the result is laid out in
# a scratch folder as the stage's filesystem, and `cargo build --locked` runs in its WORKDIR.
# A file the build needs that the Dockerfile does not copy (a bench target named in
# Cargo.toml, a template, a migration, an `include_str!`) fails here as it would fail there.
#
# The target directory is the repository's own (CARGO_TARGET_DIR, default ./target): the
# dependencies are already compiled there, so only the crate itself is compiled again (it is:
# the copies are newer than its last build). Debug is enough to find a missing file; the image
# builds with --release.
#
# Usage: bash .ci/docker-context.sh [Dockerfile]     (DOCKER_CONTEXT_DRY_RUN=1: lay out only)
set -euo pipefail
shopt -s inherit_errexit

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
dockerfile=${1:-Dockerfile}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
# A fixed place outside the repository (cargo would take the repository's manifest for a parent
# workspace), laid anew each run: the same path keeps cargo's hash of the crate, and so its
# incremental state, from one run to the next.
scratch=${XDG_CACHE_HOME:-$HOME/.cache}/toolgate-ci/docker-context
rm -rf "$scratch"
mkdir -p "$scratch"

workdir=$(python3 - "$root" "$dockerfile" "$scratch/rootfs" <<'PY'
import fnmatch, glob, json, os, re, shlex, shutil, sys

context, dockerfile, rootfs = sys.argv[1], sys.argv[2], sys.argv[3]

def instructions(path):
    """(keyword, rest) per instruction: comments dropped, continuation lines joined."""
    out, buf = [], ""
    for line in open(path, encoding="utf-8"):
        s = line.rstrip("\n")
        if not buf and (s.lstrip().startswith("#") or not s.strip()):
            continue
        if s.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        kw, _, rest = buf.strip().partition(" ")
        out.append((kw.upper(), rest.strip()))
        buf = ""
    if buf.strip():
        kw, _, rest = buf.strip().partition(" ")
        out.append((kw.upper(), rest.strip()))
    return out

stages, cur = [], None
for kw, rest in instructions(os.path.join(context, dockerfile)):
    if kw == "FROM":
        m = re.match(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
        cur = {"image": m.group(1), "name": (m.group(2) or "").lower(), "ops": []}
        stages.append(cur)
    elif cur is not None:
        cur["ops"].append((kw, rest))
if len(stages) < 2:
    sys.exit(f"{dockerfile}: expected a build stage and a runtime stage, found {len(stages)} stage(s)")

# The build stage is the one the last stage copies its binary from.
def copy_args(rest):
    if rest.startswith("["):
        words = json.loads(rest)
        flags = []
    else:
        words = shlex.split(rest)
        flags = [w for w in words if w.startswith("--")]
        words = [w for w in words if not w.startswith("--")]
        # JSON form may follow flags.
        tail = rest.split(None, len(flags))[-1] if flags else rest
        if tail.startswith("["):
            words = json.loads(tail)
    return flags, words

froms = [f.split("=", 1)[1].lower() for kw, rest in stages[-1]["ops"] if kw == "COPY"
         for f in copy_args(rest)[0] if f.startswith("--from=")]
names = [s["name"] for s in stages]
build = next((s for s in stages if froms and s["name"] == froms[0]), stages[0])
print(f"build stage: FROM {build['image']}" + (f" AS {build['name']}" if build["name"] else ""), file=sys.stderr)

# .dockerignore, with Docker's rules: patterns relative to the context root, `*` and `?`
# within one path element, `**` across any number, a pattern also excludes everything below a
# directory it matches, `!` re-includes, and the last matching pattern wins.
rules = []
ignore_file = os.path.join(context, ".dockerignore")
if os.path.exists(ignore_file):
    for line in open(ignore_file, encoding="utf-8"):
        p = line.strip()
        if not p or p.startswith("#"):
            continue
        neg = p.startswith("!")
        p = os.path.normpath(p[1:].strip() if neg else p).lstrip("/")
        rx = ""
        i = 0
        while i < len(p):
            if p.startswith("**", i):
                rx += ".*"
                i += 2
                if p.startswith("/", i):
                    rx = rx[:-2] + "(?:.*/)?"
                    i += 1
            elif p[i] == "*":
                rx += "[^/]*"; i += 1
            elif p[i] == "?":
                rx += "[^/]"; i += 1
            else:
                rx += re.escape(p[i]); i += 1
        rules.append((re.compile(rx + r"(?:/.*)?\Z"), neg))

def ignored(rel):
    verdict = False
    for rx, neg in rules:
        if rx.match(rel):
            verdict = not neg
    return verdict

def context_files(rel_src):
    """The files of the context under rel_src that survive .dockerignore."""
    full = os.path.join(context, rel_src)
    if os.path.isfile(full):
        return [rel_src] if not ignored(rel_src) else []
    found = []
    for d, dirs, files in os.walk(full):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), context)
            if not ignored(rel):
                found.append(rel)
    return found

workdir = "/"
copied = 0
for kw, rest in build["ops"]:
    if kw == "WORKDIR":
        workdir = os.path.join(workdir, rest)
    elif kw in ("COPY", "ADD"):
        flags, words = copy_args(rest)
        if any(f.startswith("--from=") for f in flags):
            continue
        *srcs, dest = words
        if not srcs:
            sys.exit(f"{dockerfile}: {kw} {rest}: no source")
        dest_abs = os.path.join(workdir, dest)
        into_dir = dest.endswith("/") or len(srcs) > 1
        for src in srcs:
            rel = os.path.normpath(src).lstrip("/")
            matches = [os.path.relpath(m, context) for m in glob.glob(os.path.join(context, rel))]
            matches = [m for m in matches if not ignored(m)]
            if not matches:
                sys.exit(f"{dockerfile}: {kw} {src}: not found in the build context (or excluded by .dockerignore)")
            for m in sorted(matches):
                is_dir = os.path.isdir(os.path.join(context, m))
                for f in context_files(m):
                    if is_dir:
                        target = os.path.join(dest_abs, os.path.relpath(f, m))
                    elif into_dir or len(matches) > 1 or os.path.isdir(rootfs + dest_abs):
                        target = os.path.join(dest_abs, os.path.basename(f))
                    else:
                        target = dest_abs
                    out = rootfs + os.path.normpath(target)
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    # Content and mode, not the time: newer files make cargo compile the crate
                    # again from this context, whatever its fingerprints say.
                    shutil.copy(os.path.join(context, f), out)
                    copied += 1
        print(f"  {kw} {rest}", file=sys.stderr)
print(f"{copied} file(s) copied into the build stage", file=sys.stderr)
os.makedirs(rootfs + workdir, exist_ok=True)
print(rootfs + os.path.normpath(workdir))
PY
)

echo "building in $workdir (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
if [[ ${DOCKER_CONTEXT_DRY_RUN:-} == 1 ]]; then
  find "$workdir" -maxdepth 1 | sort
  exit 0
fi
cd "$workdir"
cargo build --locked
echo "the Dockerfile's build stage has every file the crate needs"
