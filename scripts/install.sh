#!/usr/bin/env bash
# Installs (or upgrades) futureq as a systemd service: the release binary in /usr/local/bin,
# the `futureq` user, /etc/futureq/config.yaml (from config.example.yaml, dataDir under
# /var/lib/futureq; an existing one is kept), the README as the unit's documentation, and the
# unit. Run as root from a checkout. Idempotent; an upgrade restarts a running service.
#
#   sudo scripts/install.sh                      # builds as the user who ran sudo, then installs
#   sudo scripts/install.sh --binary PATH        # installs a binary built elsewhere (no build)
#   sudo scripts/install.sh --no-start           # installs without (re)starting the service
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
binary=""
start=1
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="${2:?--binary needs a path}"; shift ;;
    --no-start) start=0 ;;
    --no-build) binary="$root/target/release/futureq" ;;
    *) echo "usage: $0 [--binary PATH | --no-build] [--no-start]" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "install.sh must run as root (sudo $0)" >&2; exit 1; }

if [ -z "$binary" ]; then
  # Never build as root: root's toolchain may be missing or differ, and target/ would end up
  # owned by root. Build as the user who ran sudo, in their checkout.
  if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    echo "install: building as $SUDO_USER"
    sudo -u "$SUDO_USER" -H bash -lc 'cd "$1" && cargo build --release -p futureq' _ "$root"
  else
    echo "install: not building as root; build first (cargo build --release -p futureq) and pass --binary target/release/futureq, or run this through sudo" >&2
    exit 1
  fi
  binary="$root/target/release/futureq"
fi
[ -x "$binary" ] || { echo "install: $binary is not an executable" >&2; exit 1; }
"$binary" --version >/dev/null || { echo "install: $binary does not run here" >&2; exit 1; }

was_active=0
if [ -d /run/systemd/system ] && systemctl is-active --quiet futureq 2>/dev/null; then
  was_active=1
fi
install -m 0755 "$binary" /usr/local/bin/futureq.new
mv -f /usr/local/bin/futureq.new /usr/local/bin/futureq

if ! id futureq >/dev/null 2>&1; then
  useradd --system --home-dir /var/lib/futureq --shell /usr/sbin/nologin futureq
fi
install -d -o futureq -g futureq -m 0750 /var/lib/futureq
install -d -m 0755 /etc/futureq /usr/local/share/doc/futureq
install -m 0644 "$root/README.md" /usr/local/share/doc/futureq/README.md
if [ ! -f /etc/futureq/config.yaml ]; then
  sed 's#dataDir: ./data #dataDir: /var/lib/futureq/data#' "$root/config.example.yaml" > /etc/futureq/config.yaml
  chmod 0644 /etc/futureq/config.yaml
fi
install -m 0644 "$root/scripts/futureq.service" /etc/systemd/system/futureq.service
systemd-analyze verify /etc/systemd/system/futureq.service

if [ "$start" = 1 ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  if [ "$was_active" = 1 ]; then
    echo "install: restarting the running service on the new binary"
    systemctl restart futureq
  else
    systemctl enable --now futureq
  fi
  systemctl --no-pager status futureq || true
else
  echo "installed; start with: systemctl daemon-reload && systemctl enable --now futureq"
fi
