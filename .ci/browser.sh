#!/usr/bin/env bash
# The admin UI in a real browser: installs what the browser tests need (Debian's chromium and
# chromium-driver when missing, playwright-core, the MCP TypeScript SDK and the test OpenID
# Provider (oidc-provider) from their lockfiles; no browser download), builds toolgate, and runs
# every tests/browser/*.test.mjs with node's test runner (mcp-remote: the bridge desktop hosts run,
# registering itself and held for an admin; oauth-host: a host signing a person in
# through the SDK; connections: a person connecting to an upstream's own sign-in). Exits non-zero on any failure. Screenshots land in $SCREENSHOT_DIR (default
# target/browser-screenshots).
#
# Needs: Postgres on 127.0.0.1:5432 with trust auth (PG_BASE to change), Node 20 or newer, npm.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
  echo "installing chromium and chromium-driver (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium chromium-driver >/dev/null
fi
/usr/bin/chromium --version

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "installing nodejs and npm (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nodejs npm >/dev/null
fi
node --version

# playwright-core only: it drives the system Chromium and never downloads a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
(cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
# The real OpenID Provider the SSO test signs in through.
(cd tests/oidc-provider && npm ci --no-audit --no-fund --loglevel=error)

cargo build --bin toolgate

export TOOLGATE_BIN=$root/target/debug/toolgate
export SCREENSHOT_DIR=${SCREENSHOT_DIR:-$root/target/browser-screenshots}
export PG_BASE=${PG_BASE:-postgres://${PGUSER:-root}@127.0.0.1:5432}
cd tests/browser
# One process per file, one at a time: each starts its own toolgate (and provider).
node --test --test-concurrency=1 ./*.test.mjs
echo "screenshots in $SCREENSHOT_DIR"
