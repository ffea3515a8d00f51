#!/usr/bin/env bash
# Headless Chromium for the browser tests (tests/test_report.py renders the report and an alert
# mail at 1280 and 390 px): Debian's chromium package. infra/bootstrap.sh runs this script, so
# `make test` has the browser on a fresh machine. Installs as root, or through `sudo -n`;
# otherwise it says what to run. Without the browser the test fails, unless
# BROKERLENS_SKIP_BROWSER_TESTS=1 opts out of the browser checks (then nothing is installed).
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "${BROKERLENS_SKIP_BROWSER_TESTS:-}" = "1" ]; then
  echo "install-test-browser: no chromium; BROKERLENS_SKIP_BROWSER_TESTS=1, so the browser tests are skipped" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-browser: no chromium and no apt-get: install Chromium (chromium on PATH)," \
       "or set BROKERLENS_SKIP_BROWSER_TESTS=1 to skip the browser tests" >&2
  exit 1
fi
if [ "$(id -u)" = "0" ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-test-browser: chromium is missing; run: sudo $0" \
       "(or set BROKERLENS_SKIP_BROWSER_TESTS=1 to skip the browser tests)" >&2
  exit 1
fi
echo "install-test-browser: installing chromium (headless checks of the report and the alert mail)" >&2
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null
