#!/usr/bin/env bash
# Debian packages the tests start themselves (loopback only, stopped by the test):
#   chromium   tests/test_report.py renders the report and an alert mail at 1280 and 390 px
#              (BROKERLENS_SKIP_BROWSER_TESTS=1 opts out)
#   prometheus tests/test_prometheus_server.py loads a day with promtool and queries a real server
#              (BROKERLENS_SKIP_SERVER_TESTS=1 opts out)
# `make test` runs this first, so a fresh machine has them. Installs as root, or through
# `sudo -n`; otherwise it says what to run. A missing tool fails its tests unless opted out.
# Debian's prometheus package also installs a system service; the tests never use it.
set -euo pipefail

missing=()
if ! command -v chromium >/dev/null 2>&1 && [ "${BROKERLENS_SKIP_BROWSER_TESTS:-}" != "1" ]; then
  missing+=(chromium)
fi
if ! { command -v prometheus && command -v promtool; } >/dev/null 2>&1 && [ "${BROKERLENS_SKIP_SERVER_TESTS:-}" != "1" ]; then
  missing+=(prometheus)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

hint="(or set BROKERLENS_SKIP_BROWSER_TESTS=1 / BROKERLENS_SKIP_SERVER_TESTS=1 to skip those tests)"
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-tools: missing ${missing[*]} and no apt-get: install them $hint" >&2
  exit 1
fi
if [ "$(id -u)" = "0" ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "install-test-tools: missing ${missing[*]}; run: sudo $0 $hint" >&2
  exit 1
fi
echo "install-test-tools: installing ${missing[*]} for the tests" >&2
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
