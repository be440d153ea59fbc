#!/usr/bin/env bash
# Installs what `futureq-bench nemesis` needs for network partitions: nftables (apt).
# Without it (or without the privilege to load rules) the nemesis skips partitions and says so.
set -euo pipefail
if command -v nft >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-nemesis: not root; install nftables yourself (apt-get install nftables)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || true
apt-get install -y -qq nftables >/dev/null || echo "install-nemesis: apt-get install nftables failed" >&2
