#!/usr/bin/env bash
# Installs the peer systems `futureq-bench compare` measures beside futureq, when missing:
# Redis (Debian `redis-server`) and NATS (Debian `nats-server`). Needs apt (root or sudo).
# The Debian packages' own services are stopped and disabled: the bench starts its own
# instances on 127.0.0.1 ports and leaves nothing running.
set -euo pipefail
want=()
command -v redis-server >/dev/null || want+=(redis-server)
command -v nats-server >/dev/null || want+=(nats-server)
if [ ${#want[@]} -eq 0 ]; then
  echo "peers already installed: $(redis-server --version | cut -d' ' -f3), nats-server $(nats-server --version | awk '{print $2}')"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${want[@]}"
for svc in redis-server nats-server; do
  if command -v systemctl >/dev/null && systemctl list-unit-files "$svc.service" >/dev/null 2>&1; then
    $sudo systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
done
echo "installed: ${want[*]}"
