#!/usr/bin/env bash
# Interop suite: drives the real futureq binary with Python grpcio, a gRPC implementation we
# did not write. Installs grpcio into a project venv (target/interop-venv) on first use.
#
#   scripts/interop-python.sh [path/to/futureq]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/futureq}"
venv="$root/target/interop-venv"
py="${PYTHON:-python3}"

if [ ! -x "$bin" ]; then
  echo "interop: building futureq"
  (cd "$root" && cargo build -q -p futureq)
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import grpc, grpc_tools, grpc_reflection, grpc_status" 2>/dev/null; then
  echo "interop: installing grpcio, grpcio-tools, grpcio-reflection and grpcio-status into $venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$root/scripts/interop/requirements.txt"
fi
bin="$(realpath "$bin")"
gen="$root/target/interop-gen"
rm -rf "$gen" && mkdir -p "$gen"
"$venv/bin/python" -m grpc_tools.protoc -I "$root/net/proto" --python_out="$gen" --grpc_python_out="$gen" \
  "$root/net/proto/futureq.proto" "$root/net/proto/health.proto"
PYTHONPATH="$gen" "$venv/bin/python" "$root/scripts/interop/test_grpcio.py" "$bin"
