#!/usr/bin/env bash
# Regenerate the Python code of proto/phalanx/v1/*.proto with grpcio-tools (the venv's, 1.81.*).
# Usage: hack/gen-proto.sh [OUT_DIR]   (default: the repository itself)
# Run from anywhere; protoc runs at the repository root with `-I .`, so the generated modules
# import each other as proto.phalanx.v1.*. tests/unit/test_proto_generated.py runs this script
# into a temporary directory and fails when the committed files differ.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="$(mkdir -p "${1:-$ROOT}" && cd "${1:-$ROOT}" && pwd)"
cd "$ROOT"
"$PYTHON" -m grpc_tools.protoc -I . --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" \
  proto/phalanx/v1/*.proto
