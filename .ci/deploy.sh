#!/usr/bin/env bash
# Checks the deployment files without a container engine or a cluster:
# - docker-compose.yml with a real Compose parser (`docker-compose config`, docker-compose v1
#   from PyPI: it parses, interpolates and validates against the Compose schema it ships), then
#   what a schema cannot see (.ci/deploy_checks.py compose: the public URL is the README
#   quickstart's, instances start after the migration, ...);
# - deploy/nginx/nginx.conf with `nginx -t` (the upstream host names, which only compose's
#   network resolves, are read as 127.0.0.1);
# - deploy/kubernetes/*.yaml with kubernetes-validate (PyPI; it ships the schemas), strict, for
#   one Kubernetes version, then .ci/deploy_checks.py kubernetes, and folders.yaml up to date.
#
# Venvs live under CACHE (default ~/.cache/toolgate-ci), rebuilt when their requirements change.
# Usage: bash .ci/deploy.sh compose|nginx|kubernetes|all
set -euo pipefail
shopt -s inherit_errexit

cd "$(dirname "${BASH_SOURCE[0]}")/.."
cache=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/toolgate-ci}
kubernetes_version=1.32.0
what=${1:-all}

venv() { # dir, requirements file, [pre-install command...]; prints the venv's bin dir
  local dir=$1 req=$2
  shift 2
  local want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [[ ! -x $dir/bin/python || $(cat "$dir/.requirements.sha256" 2>/dev/null) != "$want" ]]; then
    rm -rf "$dir"
    python3 -m venv "$dir" >&2
    if (($#)); then "$@" "$dir" >&2; fi
    "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
    echo "$want" >"$dir/.requirements.sha256"
  fi
  echo "$dir/bin"
}

# docker-compose 1.29.2 needs PyYAML < 6, whose last release has no wheel for this Python and
# does not build with Cython 3.
pyyaml5() { # venv dir
  "$1/bin/pip" install --quiet --disable-pip-version-check "Cython==0.29.37" wheel
  "$1/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation "PyYAML==5.4.1"
}

check_compose() {
  echo "--- docker-compose.yml: docker-compose config (Compose schema, interpolation)"
  local bin out
  bin=$(venv "$cache/venv-compose" .ci/requirements-compose.txt pyyaml5)
  out=$(mktemp)
  TOOLGATE_ADMIN_TOKEN=ci-check "$bin/docker-compose" -f docker-compose.yml config >"$out"
  echo "docker-compose.yml parses and validates ($("$bin/docker-compose" version --short))"
  "$bin/python" .ci/deploy_checks.py compose "$out"
  rm -f "$out"
}

check_nginx() {
  echo "--- deploy/nginx/nginx.conf: nginx -t"
  if ! command -v nginx >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null; }
  fi
  local tmp
  tmp=$(mktemp -d)
  sed -E 's/server toolgate-[a-z]+:/server 127.0.0.1:/; s#^pid .*#pid '"$tmp"'/nginx.pid;#' \
    deploy/nginx/nginx.conf >"$tmp/nginx.conf"
  cp deploy/nginx/proxy.conf "$tmp/"
  nginx -t -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/error.log"
  rm -rf "$tmp"
}

check_kubernetes() {
  echo "--- deploy/kubernetes: kubernetes-validate --strict, Kubernetes $kubernetes_version"
  local bin
  bin=$(venv "$cache/venv-kubernetes" .ci/requirements-kubernetes.txt)
  python3 deploy/kubernetes/folders.py --check
  local files=()
  for f in deploy/kubernetes/*.yaml; do
    [[ $(basename "$f") == kustomization.yaml ]] || files+=("$f")
  done
  "$bin/kubernetes-validate" --strict -k "$kubernetes_version" "${files[@]}"
  "$bin/python" .ci/deploy_checks.py kubernetes
}

case $what in
  compose) check_compose ;;
  nginx) check_nginx ;;
  kubernetes) check_kubernetes ;;
  all)
    check_compose
    check_nginx
    check_kubernetes
    ;;
  *) echo "usage: $0 compose|nginx|kubernetes|all" >&2; exit 2 ;;
esac
