#!/usr/bin/env bash
# Build phalanx-scheduler (kube-scheduler v1.37.2 with phalanx's framework plugin, plugin/) into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s/<K8S_VERSION>/phalanx-scheduler
# beside the e2e control plane. Idempotent: does nothing when the binary was built from the same
# plugin sources (a stamp records their hash and the pinned versions). Versions: plugin/go.mod
# (k8s.io/kubernetes and the staging modules at their v0.X.Y releases, as hack/build-k8s.sh) and
# hack/versions.env. Nothing is downloaded except through the Go module proxy; the log goes to
# the cache dir.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=k8s-module.sh
source "$HACK/k8s-module.sh"

OUT="$CACHE/k8s/$K8S_VERSION"
BIN="$OUT/phalanx-scheduler"
STAMP="$OUT/.phalanx-scheduler.built"
LOG="$OUT/phalanx-scheduler.build.log"
SOURCES="$(cd "$ROOT/plugin" && find . -name '*.go' -not -name '*_test.go' -o -name go.mod -o -name go.sum \
  | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
WANT="k8s=$K8S_VERSION sources=$SOURCES"

if built "$STAMP" "$WANT" "$BIN"; then
  echo "build-plugin: phalanx-scheduler already built in $OUT"
  exit 0
fi
go_env
mkdir -p "$OUT"
LDFLAGS="$(k8s_ldflags)"
echo "build-plugin: building phalanx-scheduler into $OUT (log: $LOG)"
START=$(date +%s)
(cd "$ROOT/plugin" && go build -p 2 -trimpath -ldflags "$LDFLAGS" -o "$BIN.tmp" ./cmd/phalanx-scheduler) >"$LOG" 2>&1 \
  || fail "go build ./cmd/phalanx-scheduler"
mv -f "$BIN.tmp" "$BIN"
echo "$WANT" >"$STAMP"
echo "build-plugin: done in $(( $(date +%s) - START ))s"
