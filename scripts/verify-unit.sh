#!/usr/bin/env bash
# Checks scripts/futureq.service with systemd-analyze verify (installing systemd's tools if
# missing). The unit's ExecStart names the installed path, so the check runs on a copy whose
# ExecStart points at the binary built in this checkout.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/futureq}"
if ! command -v systemd-analyze >/dev/null; then
  echo "verify-unit: installing systemd (for systemd-analyze)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi
[ -x "$bin" ] || (cd "$root" && cargo build -q -p futureq)
bin="$(realpath "$bin")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
sed "s#/usr/local/bin/futureq#$bin#" "$root/scripts/futureq.service" > "$tmp/futureq.service"
out="$(systemd-analyze verify --man=no "$tmp/futureq.service" 2>&1)" || { echo "$out"; exit 1; }
# verify exits 0 on some warnings: treat any message about our unit as a failure.
if echo "$out" | grep -q "futureq.service"; then
  echo "$out"
  exit 1
fi
echo "verify-unit: futureq.service OK"
