#!/usr/bin/env bash
# Runs a 3-node futureq cluster on this machine: node i listens on 127.0.0.i
# (gRPC :8443, Raft :50005, metrics :9090), with its data under $DIR/node-i.
#
#   scripts/cluster-local.sh            # build (release), start, wait for a leader; Ctrl-C stops all
#   DIR=/tmp/fq RTT=50ms scripts/cluster-local.sh   # RTT: cluster.raft.rtt (default: the broker's, 20ms)
#
# Any node answers GetClusterInfo; publish and subscribe on the leader it names.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-$(mktemp -d /tmp/futureq-cluster.XXXXXX)}
RTT=${RTT:-20ms}
BIN=${BIN:-target/release/futureq}
[ -x "$BIN" ] && [ -z "${REBUILD:-}" ] || cargo build --release -p futureq
members="{1: \"127.0.0.1:50005\", 2: \"127.0.0.2:50005\", 3: \"127.0.0.3:50005\"}"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop EXIT INT TERM
for i in 1 2 3; do
  mkdir -p "$DIR/node-$i"
  FUTUREQ_CLUSTER_ENABLED=true \
  FUTUREQ_CLUSTER_NODEID=$i \
  FUTUREQ_CLUSTER_RAFT_LISTEN=127.0.0.$i:50005 \
  FUTUREQ_CLUSTER_RAFT_ADVERTISE=127.0.0.$i:50005 \
  FUTUREQ_CLUSTER_RAFT_DATADIR="$DIR/node-$i/raft" \
  FUTUREQ_CLUSTER_RAFT_INITIALMEMBERS="$members" \
  FUTUREQ_CLUSTER_RAFT_RTT=$RTT \
  FUTUREQ_API_GRPC_LISTEN=127.0.0.$i:8443 \
  FUTUREQ_API_GRPC_ADVERTISE=127.0.0.$i:8443 \
  FUTUREQ_OBSERVABILITY_METRICS_LISTEN=127.0.0.$i:9090 \
  FUTUREQ_STORAGE_DATADIR="$DIR/node-$i/data" \
  "$BIN" start >"$DIR/node-$i.log" 2>&1 &
  pids+=($!)
done
echo "3 nodes starting; data and logs in $DIR"
for _ in $(seq 100); do
  for i in 1 2 3; do
    if grep -q "leading the event shard" "$DIR/node-$i.log" 2>/dev/null; then
      echo "leader: node $i (gRPC 127.0.0.$i:8443)"; echo "Ctrl-C stops the cluster"; wait; exit 0
    fi
  done
  sleep 0.1
done
echo "no leader after 10 s; see $DIR/node-*.log" >&2
exit 1
