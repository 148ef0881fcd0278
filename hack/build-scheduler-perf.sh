#!/usr/bin/env bash
# Build upstream's scheduler_perf benchmark with phalanx's plugin in its out-of-tree registry
# (bench/scheduler_perf, a Go test binary) into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s/<K8S_VERSION>/scheduler-perf.test
# and print two lines: the binary's path and the folder of upstream's scheduler_perf workloads in
# the pinned k8s.io/kubernetes module (its etcd is the one beside the binary). Idempotent: does
# nothing when the binary was built from the same
# sources (bench/scheduler_perf and plugin/, hashed in a stamp). Built with -trimpath, as every
# other Go build here, so it reuses the packages hack/build-k8s.sh and hack/build-plugin.sh
# compiled (the API server, the scheduler, client-go: most of its size) from Go's build cache
# instead of compiling them again. The in-process test API server then finds its certificates
# under TEST_SRCDIR/TEST_WORKSPACE (upstream's way for -trimpath builds, see pkgPath in
# cmd/kube-apiserver/app/testing/testserver.go): the runner sets TEST_SRCDIR to the Go module
# cache. The benchmark takes etcd from the e2e control plane (hack/build-k8s.sh).
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$CACHE/k8s/$K8S_VERSION"
BIN="$OUT/scheduler-perf.test"
STAMP="$OUT/.scheduler-perf.built"
LOG="$OUT/scheduler-perf.build.log"
SOURCES="$(cd "$ROOT" && find bench/scheduler_perf plugin -name '*.go' -o -name go.mod -o -name go.sum \
  | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
WANT="k8s=$K8S_VERSION sources=$SOURCES trimpath"

go_env
if built "$STAMP" "$WANT" "$BIN"; then
  echo "build-scheduler-perf: scheduler-perf.test already built in $OUT" >&2
else
  mkdir -p "$OUT"
  echo "build-scheduler-perf: building scheduler-perf.test into $OUT (log: $LOG)" >&2
  START=$(date +%s)
  (cd "$ROOT/bench/scheduler_perf" && go test -c -p 2 -trimpath -o "$BIN.tmp" .) >"$LOG" 2>&1 \
    || fail "go test -c ./bench/scheduler_perf"
  mv -f "$BIN.tmp" "$BIN"
  echo "$WANT" >"$STAMP"
  echo "build-scheduler-perf: done in $(( $(date +%s) - START ))s" >&2
fi
echo "$BIN"
(cd "$ROOT/bench/scheduler_perf" && go list -m -f '{{.Dir}}' k8s.io/kubernetes) | sed 's|$|/test/integration/scheduler_perf|'
