#!/usr/bin/env bash
# Regenerate the Go code of proto/phalanx/v1/scheduler_plugin.proto into plugin/gen/phalanx/v1
# (the scheduling plugin's client). protoc is the venv's grpcio-tools (as for the Python code);
# protoc-gen-go and protoc-gen-go-grpc are built at the versions pinned in hack/versions.env into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/tools/<version>/
# once (through the Go module proxy), then reused.
# Usage: hack/gen-proto-go.sh [OUT_DIR]   (default: the repository's plugin/ module)
# tests/unit/test_proto_generated.py runs this into a temporary directory and fails when the
# committed files differ.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="$(mkdir -p "${1:-$ROOT/plugin}" && cd "${1:-$ROOT/plugin}" && pwd)"
TOOLS="$CACHE/tools"

tool() {  # tool NAME PACKAGE VERSION -> path of the built binary
  local dir="$TOOLS/$1-$3"
  if [[ ! -x "$dir/$1" ]]; then
    go_env
    mkdir -p "$dir"
    GOBIN="$dir" go install "$2@$3" >&2
  fi
  echo "$dir/$1"
}
GEN_GO="$(tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION")"
GEN_GRPC="$(tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION")"
cd "$ROOT"
"$PYTHON" -m grpc_tools.protoc -I . \
  --plugin=protoc-gen-go="$GEN_GO" --plugin=protoc-gen-go-grpc="$GEN_GRPC" \
  --go_out="$OUT" --go_opt=module=phalanx.dev/scheduler-plugin \
  --go-grpc_out="$OUT" --go-grpc_opt=module=phalanx.dev/scheduler-plugin \
  proto/phalanx/v1/scheduler_plugin.proto
