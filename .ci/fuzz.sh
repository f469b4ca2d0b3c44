#!/usr/bin/env bash
# Fuzz targets (fuzz/, libFuzzer through cargo-fuzz on the nightly toolchain): builds them,
# replays every committed corpus, then fuzzes each target briefly. Exits non-zero on any
# crash, leak, timeout or failed invariant; the crashing input is left in fuzz/artifacts/.
#
# FUZZ_SECONDS: fuzzing time per target after the replay (default 60; 0 replays only).
# FUZZ_TOOLCHAIN: the toolchain to build with (default nightly; sanitizers need nightly).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"
toolchain=${FUZZ_TOOLCHAIN:-nightly}
seconds=${FUZZ_SECONDS:-60}
# The sanitizer build of every dependency takes many minutes on a small machine: keep it
# between runs on the same machine (a new machine builds it once).
export CARGO_TARGET_DIR=${FUZZ_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/toolgate-ci/fuzz-target}

if ! cargo "+$toolchain" --version >/dev/null 2>&1; then
  echo "fuzzing needs the $toolchain toolchain (rustup toolchain install $toolchain)" >&2
  exit 1
fi
if ! cargo "+$toolchain" fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
cargo "+$toolchain" fuzz --version

mapfile -t targets < <(cargo "+$toolchain" fuzz list)
echo "targets: ${targets[*]}"
cargo "+$toolchain" fuzz build -O

# New inputs go to a scratch folder, so a CI run never changes the committed corpora.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Runs the fuzzer; on failure shows the end of its log (the panic or sanitizer report).
run() { # target, log, fuzzer arguments...
  local t=$1 log=$2
  shift 2
  if ! cargo "+$toolchain" fuzz run -O "$t" "$@" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "$t: the fuzzer failed; the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
}

for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "--- $t: replaying $(find "corpus/$t" -type f | wc -l) committed inputs"
  run "$t" "$scratch/$t-replay.log" "corpus/$t" -- -runs=0 -timeout=10 -print_final_stats=1
done

if ((seconds > 0)); then
  for t in "${targets[@]}"; do
    echo "--- $t: fuzzing for ${seconds}s"
    mkdir -p "$scratch/$t"
    run "$t" "$scratch/$t.log" "$scratch/$t" "corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -print_final_stats=1
  done
fi
echo "fuzz: every corpus replays and no target crashed"
