#!/usr/bin/env bash
# Runs the official MCP conformance suite's fixture-independent server scenarios against a
# running toolgate, on both wires (2026-07-28 stateless, 2025-11-25 handshake).
#
#   bash .ci/conformance.sh http://127.0.0.1:PORT/mcp
#
# The suite sends no Authorization header, so the server under test must run with
# `--dev-agent NAME` (loopback only) and that agent must see at least one tool (.ci/run uses
# `assistant`). Failures are judged against .ci/conformance-expected-failures.yml: the script
# exits non-zero on any failure not listed there, and on any listed check that now passes.
#
# Needs Node >= 22: the machine's Node may be older, so npx also fetches the `node` package.
# Environment: CONFORMANCE_VERSION (default 0.2.0-alpha.12), CONFORMANCE_OUT (results folder,
# default .ci-results/conformance), CONFORMANCE_BASELINE (default the file beside this script).
set -euo pipefail

url=${1:?usage: conformance.sh http://127.0.0.1:PORT/mcp}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${CONFORMANCE_VERSION:-0.2.0-alpha.12}
baseline=${CONFORMANCE_BASELINE:-$here/conformance-expected-failures.yml}
out=${CONFORMANCE_OUT:-$here/../.ci-results/conformance}

# Scenario runs: "<spec-version> <scenario>". Each names no fixture tool of the suite's own,
# apart from the server-stateless checks listed in the baseline.
runs=(
  "2026-07-28 server-stateless"
  "2026-07-28 http-header-validation"
  "2026-07-28 dns-rebinding-protection"
  "2026-07-28 tools-list"
  "2026-07-28 caching"
  "2025-11-25 server-initialize"
  "2025-11-25 tools-list"
  "2025-11-25 ping"
)

# The baseline may excuse only checks that need the suite's fixture tools: one check per
# entry, each saying which `test_*` tool it needs. Anything else is a bug to fix, not to list.
bad_entries=$(grep -nE '^[[:space:]]*-' "$baseline" \
  | grep -vE '^[0-9]+:[[:space:]]*- [a-z0-9-]+:[a-z0-9-]+[[:space:]]+# fixture test_[A-Za-z0-9_]+' || true)
if [[ -n $bad_entries ]]; then
  echo "conformance: $baseline has entries that are not '<scenario>:<check-id> # fixture test_...':" >&2
  echo "$bad_entries" >&2
  exit 2
fi

rm -rf "$out"
mkdir -p "$out"

conformance() {
  npx -y -p node@22 -p "@modelcontextprotocol/conformance@$version" -- conformance "$@"
}

# One line per run: passed, failed and skipped checks, the failing check ids, and the
# suite's verdict against the baseline.
summarize() { # results-dir
  python3 - "$1" <<'EOF'
import glob, json, sys
checks = []
for f in glob.glob(sys.argv[1] + "/**/checks.json", recursive=True):
    checks += json.load(open(f))
count = lambda s: sum(1 for c in checks if c["status"] == s)
failed = sorted({c["id"] for c in checks if c["status"] in ("FAILURE", "WARNING")})
print(f"{count('SUCCESS')} passed, {count('FAILURE')} failed, {count('WARNING')} warnings, "
      f"{count('SKIPPED')} skipped" + (f"; failing: {', '.join(failed)}" if failed else ""))
EOF
}

status=0
summary=()
for run in "${runs[@]}"; do
  read -r spec scenario <<<"$run"
  name="$spec/$scenario"
  log="$out/$spec-$scenario.log"
  echo "--- conformance $name"
  rc=0
  conformance server --url "$url" --scenario "$scenario" --spec-version "$spec" \
    --expected-failures "$baseline" -o "$out/$spec-$scenario" >"$log" 2>&1 || rc=$?
  # The check lines and the verdict; the whole log (minus npm's engine warnings) on failure.
  sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -vE '^npm warn' >"$log.txt"
  if ((rc == 0)); then
    grep -E '\] (SUCCESS|FAILURE|WARNING|SKIPPED)|^Passed:|Baseline check passed|^  [~✓✗] ' "$log.txt" || true
    verdict=ok
  else
    cat "$log.txt"
    verdict="FAILED (exit $rc)"
    status=1
  fi
  counts=$(summarize "$out/$spec-$scenario" 2>/dev/null || echo "no checks.json")
  summary+=("$(printf '%-10s %-26s %-16s %s' "$spec" "$scenario" "$verdict" "$counts")")
done

echo
echo "=== conformance summary (@modelcontextprotocol/conformance@$version, baseline $(basename "$baseline"))"
printf '%s\n' "${summary[@]}"
if ((status == 0)); then
  echo "conformance: PASS (failures, if any, are all fixture-only checks in the baseline)"
else
  echo "conformance: FAIL (unexpected failures or stale baseline entries above; logs in $out)"
fi
exit $status
