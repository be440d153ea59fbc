#!/usr/bin/env bash
# Runs a 3-node futureq cluster on this machine: node i listens on 127.0.0.i (gRPC
# $GRPC_PORT, Raft $RAFT_PORT, metrics $METRICS_PORT), with its data and log under $DIR.
#
#   scripts/cluster-local.sh                      # build (release), start, wait for a leader; Ctrl-C stops all
#   DIR=/tmp/fq RTT=50ms scripts/cluster-local.sh # RTT: cluster.raft.rtt (default 20ms)
#   GRPC_PORT=9443 RAFT_PORT=51005 METRICS_PORT=9190 scripts/cluster-local.sh
#   DIR=/tmp/fq scripts/cluster-local.sh restart 2    # from another shell: restart node 2 only
#   DIR=/tmp/fq scripts/cluster-local.sh stop 2       # stop node 2 (start it again with restart)
#
# Any node answers GetClusterInfo (`futureq --server 127.0.0.1:$GRPC_PORT cluster info`);
# the client commands find the leader by themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
RTT=${RTT:-20ms}
GRPC_PORT=${GRPC_PORT:-8443}
RAFT_PORT=${RAFT_PORT:-50005}
METRICS_PORT=${METRICS_PORT:-9090}
BIN=${BIN:-target/release/futureq}
cmd=${1:-run}

# Starts node $1 in the background; records its pid in $DIR/node-$1.pid.
start_node() {
  local i=$1
  local members="{1: \"127.0.0.1:$RAFT_PORT\", 2: \"127.0.0.2:$RAFT_PORT\", 3: \"127.0.0.3:$RAFT_PORT\"}"
  mkdir -p "$DIR/node-$i"
  FUTUREQ_CLUSTER_ENABLED=true \
  FUTUREQ_CLUSTER_NODEID=$i \
  FUTUREQ_CLUSTER_RAFT_LISTEN=127.0.0.$i:$RAFT_PORT \
  FUTUREQ_CLUSTER_RAFT_ADVERTISE=127.0.0.$i:$RAFT_PORT \
  FUTUREQ_CLUSTER_RAFT_DATADIR="$DIR/node-$i/raft" \
  FUTUREQ_CLUSTER_RAFT_INITIALMEMBERS="$members" \
  FUTUREQ_CLUSTER_RAFT_RTT=$RTT \
  FUTUREQ_API_GRPC_LISTEN=127.0.0.$i:$GRPC_PORT \
  FUTUREQ_API_GRPC_ADVERTISE=127.0.0.$i:$GRPC_PORT \
  FUTUREQ_OBSERVABILITY_METRICS_LISTEN=127.0.0.$i:$METRICS_PORT \
  FUTUREQ_STORAGE_DATADIR="$DIR/node-$i/data" \
  setsid "$BIN" start >>"$DIR/node-$i.log" 2>&1 &
  echo $! >"$DIR/node-$i.pid"
}

# Stops node $1 (SIGTERM, then SIGKILL after 15 s).
stop_node() {
  local f="$DIR/node-$1.pid"
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  # Only a futureq process (the pid file may be stale after a reboot).
  if grep -q futureq "/proc/$pid/cmdline" 2>/dev/null && kill "$pid" 2>/dev/null; then
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

node_arg() {
  [[ "${1:-}" =~ ^[123]$ ]] || { echo "usage: $0 $cmd 1|2|3" >&2; exit 2; }
  [ -n "${DIR:-}" ] && [ -d "$DIR" ] || { echo "$cmd needs DIR= of the running cluster" >&2; exit 2; }
}

case "$cmd" in
  restart)
    node_arg "${2:-}"
    stop_node "$2"
    start_node "$2"
    echo "node $2 restarted (pid $(cat "$DIR/node-$2.pid")); log: $DIR/node-$2.log"
    exit 0 ;;
  stop)
    node_arg "${2:-}"
    stop_node "$2"
    echo "node $2 stopped"
    exit 0 ;;
  run) ;;
  *) echo "usage: $0 [run | restart N | stop N]" >&2; exit 2 ;;
esac

DIR=${DIR:-$(mktemp -d /tmp/futureq-cluster.XXXXXX)}
[ -x "$BIN" ] && [ -z "${REBUILD:-}" ] || cargo build --release -p futureq
stop_all() { for i in 1 2 3; do stop_node "$i"; done; }
trap stop_all EXIT
trap "exit 130" INT TERM
for i in 1 2 3; do : >"$DIR/node-$i.log"; start_node "$i"; done
echo "3 nodes starting; data and logs in $DIR (DIR=$DIR for restart/stop)"
for _ in $(seq 100); do
  for i in 1 2 3; do
    if grep -q "leading the event shard" "$DIR/node-$i.log" 2>/dev/null; then
      echo "leader: node $i (gRPC 127.0.0.$i:$GRPC_PORT)"; echo "Ctrl-C stops the cluster"
      # Until Ctrl-C (nodes restarted from another shell are not children of this one).
      while true; do sleep 3600 & wait $! || true; done
    fi
  done
  sleep 0.1
done
echo "no leader after 10 s; see $DIR/node-*.log" >&2
exit 1
