#!/usr/bin/env bash
# Build KWOK (Kubernetes WithOut Kubelet), which plays the nodes and pods of phalanx's e2e control
# plane, from the sigs.k8s.io/kwok Go module into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/kwok/<KWOK_VERSION>/kwok
# Idempotent: does nothing when the pinned version is already there (.built stamp). The version is
# pinned in hack/versions.env. Needs: go (>= 1.26.0), the Go module proxy for a cold build. The
# build log goes to the cache dir, never into the repository.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$CACHE/kwok/$KWOK_VERSION"
STAMP="$OUT/.built"
WANT="kwok=$KWOK_VERSION"

if built "$STAMP" "$WANT" "$OUT/kwok"; then
  echo "build-kwok: $WANT already built in $OUT"
  exit 0
fi

go_env
start_build "$OUT" "$WANT"

# The controller's main package is sigs.k8s.io/kwok/cmd/kwok. A throwaway module requiring the
# pinned version keeps the build independent of the module's own tooling dependencies.
MOD_JSON="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" 2>>"$LOG")" \
  || fail "go mod download sigs.k8s.io/kwok@$KWOK_VERSION"
MOD_DIR="$(printf '%s\n' "$MOD_JSON" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -f "$MOD_DIR/go.mod" ]] || fail "no go.mod in sigs.k8s.io/kwok@$KWOK_VERSION"
GO_LINE="$(grep -m1 '^go ' "$MOD_DIR/go.mod")"

printf 'module phalanx.local/kwokbuild\n\n%s\n\nrequire sigs.k8s.io/kwok %s\n' "$GO_LINE" "$KWOK_VERSION" >"$WORK/go.mod"
cat >"$WORK/tools.go" <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
GO

(
  cd "$WORK"
  echo "== go mod tidy (kwok) ==" >>"$LOG"
  go mod tidy >>"$LOG" 2>&1
  echo "== go build kwok ==" >>"$LOG"
  go build -p 2 -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    -o "$WORK/kwok" sigs.k8s.io/kwok/cmd/kwok >>"$LOG" 2>&1
) || fail "go build sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"

mv -f "$WORK/kwok" "$OUT/kwok"
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
END=$(date +%s)
echo "build-kwok: done in $((END - START))s: $(ls "$OUT" | tr '\n' ' ')"
