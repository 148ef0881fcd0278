#!/usr/bin/env bash
# Build Karpenter with its KWOK cloud provider, used by phalanx's Karpenter e2e tests, from the
# sigs.k8s.io/karpenter Go module, and keep what the tests install and read next to it, in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/karpenter/<KARPENTER_VERSION>/
#     karpenter-kwok        the controller (main package sigs.k8s.io/karpenter/kwok)
#     crds/                 the module's pkg/apis/crds and kwok/apis/crds (NodePool, NodeClaim,
#                           NodeOverlay, CapacityBuffer, KWOKNodeClass)
#     instance_types.json   the KWOK provider's instance types (embedded in the binary; the tests
#                           read capacities from this copy)
# Idempotent: does nothing when the pinned version is already there (.built stamp). The version is
# pinned in hack/versions.env. The module's go.mod needs a newer Go than K8S_GOTOOLCHAIN, so the
# build runs with KARPENTER_GOTOOLCHAIN (downloaded by the go command through the module proxy).
# Needs: go (>= 1.26.0), the Go module proxy for a cold build. The build log goes to the cache
# dir, never into the repository.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$CACHE/karpenter/$KARPENTER_VERSION"
STAMP="$OUT/.built"
WANT="karpenter=$KARPENTER_VERSION"

if built "$STAMP" "$WANT" "$OUT/karpenter-kwok"; then
  echo "build-karpenter: $WANT already built in $OUT"
  exit 0
fi

go_env
start_build "$OUT" "$WANT"

# Both go commands need KARPENTER_GOTOOLCHAIN: even `go mod download` refuses a module whose go.mod
# asks for a newer Go than the running one.
GOTOOLCHAIN="$KARPENTER_GOTOOLCHAIN" module_dir sigs.k8s.io/karpenter "$KARPENTER_VERSION"
for dir in pkg/apis/crds kwok/apis/crds; do
  compgen -G "$MOD_DIR/$dir/*.yaml" >/dev/null || fail "no $dir/*.yaml in sigs.k8s.io/karpenter@$KARPENTER_VERSION"
done
TYPES="$MOD_DIR/kwok/cloudprovider/instance_types.json"
[[ -f "$TYPES" ]] || fail "no kwok/cloudprovider/instance_types.json in sigs.k8s.io/karpenter@$KARPENTER_VERSION"
GOTOOLCHAIN="$KARPENTER_GOTOOLCHAIN" build_main sigs.k8s.io/karpenter "$KARPENTER_VERSION" \
  sigs.k8s.io/karpenter/kwok karpenter-kwok "-X sigs.k8s.io/karpenter/pkg/operator.Version=$KARPENTER_VERSION"

rm -rf "$OUT/crds"
mkdir -p "$OUT/crds"
cp "$MOD_DIR"/pkg/apis/crds/*.yaml "$MOD_DIR"/kwok/apis/crds/*.yaml "$OUT/crds/"
cp "$TYPES" "$OUT/instance_types.json"
chmod -R u+w "$OUT/crds" "$OUT/instance_types.json"
mv -f "$WORK/karpenter-kwok" "$OUT/karpenter-kwok"
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
END=$(date +%s)
echo "build-karpenter: done in $((END - START))s: $(ls "$OUT" | tr '\n' ' ')"
