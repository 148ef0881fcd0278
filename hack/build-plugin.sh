#!/usr/bin/env bash
# Build phalanx-scheduler (kube-scheduler v1.37.2 with phalanx's framework plugin, plugin/) into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s/<K8S_VERSION>/phalanx-scheduler
# beside the e2e control plane. Idempotent: does nothing when the binary was built from the same
# plugin sources (a stamp records their hash and the pinned versions). Versions: plugin/go.mod
# (k8s.io/kubernetes and the staging modules at their v0.X.Y releases, as hack/build-k8s.sh) and
# hack/versions.env. Nothing is downloaded except through the Go module proxy; the log goes to
# the cache dir.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

OUT="${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s/$K8S_VERSION"
BIN="$OUT/phalanx-scheduler"
STAMP="$OUT/.phalanx-scheduler.built"
LOG="$OUT/phalanx-scheduler.build.log"
SOURCES="$(cd "$ROOT/plugin" && find . -name '*.go' -not -name '*_test.go' -o -name go.mod -o -name go.sum \
  | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
WANT="k8s=$K8S_VERSION sources=$SOURCES"

if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "build-plugin: phalanx-scheduler already built in $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "build-plugin: go is not on PATH" >&2; exit 1; }
export GOTOOLCHAIN="${GOTOOLCHAIN:-$K8S_GOTOOLCHAIN}" GOFLAGS="-buildvcs=false" CGO_ENABLED=0
mkdir -p "$OUT"
MAJOR="${K8S_VERSION#v}"; MAJOR="${MAJOR%%.*}"
MINOR="${K8S_VERSION#v*.}"; MINOR="${MINOR%%.*}"
VPKG=k8s.io/component-base/version
LDFLAGS="-s -w -X $VPKG.gitVersion=$K8S_VERSION -X $VPKG.gitMajor=$MAJOR -X $VPKG.gitMinor=$MINOR"
LDFLAGS+=" -X $VPKG.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
echo "build-plugin: building phalanx-scheduler into $OUT (log: $LOG)"
START=$(date +%s)
if ! (cd "$ROOT/plugin" && go build -p 2 -trimpath -ldflags "$LDFLAGS" -o "$BIN.tmp" ./cmd/phalanx-scheduler) >"$LOG" 2>&1; then
  echo "build-plugin: FAILED; last 40 lines of $LOG:" >&2
  tail -n 40 "$LOG" >&2
  exit 1
fi
mv -f "$BIN.tmp" "$BIN"
echo "$WANT" >"$STAMP"
echo "build-plugin: done in $(( $(date +%s) - START ))s"
