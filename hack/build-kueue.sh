#!/usr/bin/env bash
# Build the Kueue manager used by phalanx's Kueue e2e tests from the sigs.k8s.io/kueue Go module,
# and keep the manifests the tests install next to it, in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/kueue/<KUEUE_VERSION>/
#     kueue-manager                   the manager binary (controllers and webhooks)
#     crds/                           the module's config/components/crd/bases
#     crd-patches/                    the conversion-webhook patches its CRD kustomization applies
#     webhook/                        config/components/webhook/manifests.yaml
# Idempotent: does nothing when the pinned version is already there (.built stamp). The version is
# pinned in hack/versions.env. Needs: go (>= 1.26.0), the Go module proxy for a cold build. The
# build log goes to the cache dir, never into the repository.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$CACHE/kueue/$KUEUE_VERSION"
STAMP="$OUT/.built"
WANT="kueue=$KUEUE_VERSION"

if built "$STAMP" "$WANT" "$OUT/kueue-manager"; then
  echo "build-kueue: $WANT already built in $OUT"
  exit 0
fi

go_env
start_build "$OUT" "$WANT"

module_dir sigs.k8s.io/kueue "$KUEUE_VERSION"
COMPONENTS="$MOD_DIR/config/components"
[[ -d "$COMPONENTS/crd/bases" ]] || fail "no config/components/crd/bases in sigs.k8s.io/kueue@$KUEUE_VERSION"
build_main sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue kueue-manager \
  "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"

rm -rf "$OUT/crds" "$OUT/crd-patches" "$OUT/webhook"
mkdir -p "$OUT/crds" "$OUT/crd-patches" "$OUT/webhook"
cp "$COMPONENTS"/crd/bases/*.yaml "$OUT/crds/"
cp "$COMPONENTS"/crd/patches/webhook_in_*.yaml "$OUT/crd-patches/"
cp "$COMPONENTS"/crd/kustomization.yaml "$OUT/crd-patches/"
cp "$COMPONENTS"/webhook/manifests.yaml "$COMPONENTS"/webhook/kustomization.yaml "$OUT/webhook/"
chmod -R u+w "$OUT/crds" "$OUT/crd-patches" "$OUT/webhook"
mv -f "$WORK/kueue-manager" "$OUT/kueue-manager"
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
END=$(date +%s)
echo "build-kueue: done in $((END - START))s: $(ls "$OUT" | tr '\n' ' ')"
