#!/usr/bin/env bash
# Standalone figures for docs/benchmarks.md: starts a release broker in a temp dir, runs the
# load generator (publish throughput/latency at each ack level, delivery lateness for a burst
# and a steady rate), three runs each, and stops the broker.
#
#   scripts/bench-standalone.sh [runs]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-3}"
(cd "$root" && cargo build -q --release -p futureq -p futureq-bench)
dir="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
mport=$((port + 1))
FUTUREQ_API_GRPC_LISTEN="127.0.0.1:$port" FUTUREQ_OBSERVABILITY_METRICS_LISTEN="127.0.0.1:$mport" \
FUTUREQ_PUBLISH_MINACKLEVEL=noAck FUTUREQ_STORAGE_DATADIR="$dir/data" FUTUREQ_OBSERVABILITY_LOGGING_LEVEL=warn \
  "$root/target/release/futureq" start > "$dir/broker.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
until curl -sf "127.0.0.1:$mport/healthz" >/dev/null; do sleep 0.05; done
b="$root/target/release/futureq-bench"
addr="http://127.0.0.1:$port"
echo "# machine: $(nproc) CPUs, $(uname -r); broker and load generator share the machine"
for ack in quorum leader no-ack; do
  for r in $(seq "$runs"); do
    echo "## publish ack=$ack run $r"
    "$b" --addr "$addr" publish --streams 8 --window 4 --seconds 5 --ack "$ack" | grep -E "throughput|per batch"
  done
done
for r in $(seq "$runs"); do
  echo "## publish batch=1 (one ack per message) ack=quorum run $r"
  "$b" --addr "$addr" publish --streams 8 --window 4 --batch 1 --seconds 5 | grep -E "throughput|per batch"
done
for r in $(seq "$runs"); do
  echo "## lateness burst run $r"
  "$b" --addr "$addr" lateness --count 10000 --rate 0 | grep -E "lateness \|"
  echo "## lateness steady 10k/s run $r"
  "$b" --addr "$addr" lateness --count 30000 --rate 10000 | grep -E "lateness \|"
  echo "## lateness steady 100k/s run $r"
  "$b" --addr "$addr" lateness --count 300000 --rate 100000 --lead-ms 3000 | grep -E "lateness \|"
done
echo "## broker RSS after the runs: $(grep VmRSS /proc/$pid/status | awk '{print $2, $3}'), data: $(du -sh "$dir/data" | cut -f1)"
