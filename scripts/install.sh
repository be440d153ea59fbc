#!/usr/bin/env bash
# Installs futureq as a systemd service: builds the release binary, creates the `futureq`
# user, /etc/futureq/config.yaml (from config.example.yaml, with dataDir under
# /var/lib/futureq) and the unit. Run as root from a checkout. Idempotent.
#
#   scripts/install.sh [--no-build] [--no-start]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build=1
start=1
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    --no-start) start=0 ;;
    *) echo "usage: $0 [--no-build] [--no-start]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "install.sh must run as root" >&2; exit 1; }

if [ "$build" = 1 ]; then
  (cd "$root" && cargo build --release -p futureq)
fi
install -m 0755 "$root/target/release/futureq" /usr/local/bin/futureq

if ! id futureq >/dev/null 2>&1; then
  useradd --system --home-dir /var/lib/futureq --shell /usr/sbin/nologin futureq
fi
install -d -o futureq -g futureq -m 0750 /var/lib/futureq
install -d -m 0755 /etc/futureq
if [ ! -f /etc/futureq/config.yaml ]; then
  sed 's#dataDir: ./data #dataDir: /var/lib/futureq/data#' "$root/config.example.yaml" > /etc/futureq/config.yaml
  chmod 0644 /etc/futureq/config.yaml
fi
install -m 0644 "$root/scripts/futureq.service" /etc/systemd/system/futureq.service
systemd-analyze verify /etc/systemd/system/futureq.service

if [ "$start" = 1 ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable --now futureq
  systemctl --no-pager status futureq || true
else
  echo "installed; start with: systemctl daemon-reload && systemctl enable --now futureq"
fi
