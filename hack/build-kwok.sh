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
module_dir sigs.k8s.io/kwok "$KWOK_VERSION"
build_main sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok kwok \
  "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"

mv -f "$WORK/kwok" "$OUT/kwok"
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
END=$(date +%s)
echo "build-kwok: done in $((END - START))s: $(ls "$OUT" | tr '\n' ' ')"
