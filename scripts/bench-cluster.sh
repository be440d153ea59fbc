#!/usr/bin/env bash
# 3-node loopback cluster figures for docs/benchmarks.md: starts three release nodes on
# 127.0.0.1-3 (rtt 50 ms), runs the load generator against the leader at each ack level
# (8 streams x 4 batches of 100 x 100 B, then 1 stream x 1 batch), three runs each, then
# measures failover: kill -9 the leader, time until another node serves as leader.
#
#   scripts/bench-cluster.sh [runs]
#
# Before each kill the previously killed node has been restarted and has caught up (its
# applied index reached the leader's), so every failover starts from three healthy nodes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
runs="${1:-3}"
(cd "$root" && cargo build -q --release -p futureq -p futureq-bench)
dir="$(mktemp -d)"
base=$((20000 + RANDOM % 20000))
members="{1: \"127.0.0.1:$((base + 5))\", 2: \"127.0.0.2:$((base + 5))\", 3: \"127.0.0.3:$((base + 5))\"}"
declare -A pids
start_node() {
  local i=$1
  FUTUREQ_CLUSTER_ENABLED=true FUTUREQ_CLUSTER_NODEID=$i \
  FUTUREQ_CLUSTER_RAFT_LISTEN=127.0.0.$i:$((base + 5)) FUTUREQ_CLUSTER_RAFT_ADVERTISE=127.0.0.$i:$((base + 5)) \
  FUTUREQ_CLUSTER_RAFT_DATADIR="$dir/n$i/raft" FUTUREQ_CLUSTER_RAFT_INITIALMEMBERS="$members" \
  FUTUREQ_CLUSTER_RAFT_RTT=50ms FUTUREQ_PUBLISH_MINACKLEVEL=noAck \
  FUTUREQ_API_GRPC_LISTEN=127.0.0.$i:$base FUTUREQ_API_GRPC_ADVERTISE=127.0.0.$i:$base \
  FUTUREQ_OBSERVABILITY_METRICS_LISTEN=127.0.0.$i:$((base + 1)) FUTUREQ_STORAGE_DATADIR="$dir/n$i/data" \
  FUTUREQ_RUNTIME_CORES=1 FUTUREQ_OBSERVABILITY_LOGGING_LEVEL=warn \
    "$root/target/release/futureq" start >> "$dir/n$i.log" 2>&1 &
  pids[$i]=$!
}
leader() {
  for i in 1 2 3; do
    if curl -sf --max-time 1 "127.0.0.$i:$((base + 1))/metrics" 2>/dev/null | grep -q "^futureq_raft_is_leader 1"; then
      echo "$i"; return 0
    fi
  done
  return 1
}
metric() { curl -sf --max-time 1 "127.0.0.$1:$((base + 1))/metrics" 2>/dev/null | awk -v m="$2" '$1 == m { print $2 }'; }
# Waits (up to 120 s) until node $1 has applied what the leader has; prints the seconds taken.
caught_up() {
  local t0 now want got
  t0=$(date +%s%N)
  while :; do
    now=$(date +%s%N)
    [ $(( (now - t0) / 1000000000 )) -ge 120 ] && { echo "not caught up after 120 s"; return; }
    want=$(metric "$(leader)" futureq_raft_applied_index || true)
    got=$(metric "$1" futureq_raft_applied_index || true)
    if [ -n "$want" ] && [ -n "$got" ] && [ "$got" -ge "$want" ]; then
      echo "$(( (now - t0) / 1000000 )) ms"; return
    fi
    sleep 0.1
  done
}
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
for i in 1 2 3; do start_node "$i"; done
until l=$(leader); do sleep 0.05; done
b="$root/target/release/futureq-bench"
addr="http://127.0.0.$l:$base"
echo "# machine: $(nproc) CPUs, $(uname -r); three nodes (one executor each) and the load generator share it"
echo "# leader: node $l"
for ack in ${ACKS:-quorum leader no-ack}; do
  for r in $(seq "$runs"); do
    echo "## publish ack=$ack 8x4 run $r"
    "$b" --addr "$addr" publish --streams 8 --window 4 --seconds 5 --ack "$ack" 2>&1 | grep -E "throughput|per batch|Error" || true
  done
  for r in $(seq "$runs"); do
    echo "## publish ack=$ack 1x1 run $r"
    "$b" --addr "$addr" publish --streams 1 --window 1 --seconds 5 --ack "$ack" 2>&1 | grep -E "throughput|per batch|Error" || true
  done
done
for r in $(seq "$runs"); do
  until l=$(leader); do sleep 0.05; done
  t0=$(date +%s%N)
  kill -9 "${pids[$l]}"
  until n=$(leader) && [ "$n" != "$l" ]; do sleep 0.01; done
  t1=$(date +%s%N)
  echo "## failover run $r: node $l killed, node $n leads after $(( (t1 - t0) / 1000000 )) ms"
  start_node "$l"
  echo "   node $l restarted; caught up with the leader after $(caught_up "$l")"
done
