#!/usr/bin/env bash
# Servers that tests start themselves (loopback only, stopped by the test): Prometheus and promtool
# for tests/test_prometheus_server.py. Run as root on a fresh Debian/Ubuntu machine (CI, bootstrap).
# Debian's package also installs a system service; tests never use it (they start their own
# server on a free port with their own data directory).
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null
