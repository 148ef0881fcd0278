#!/usr/bin/env bash
# Build the LeaderWorkerSet controller used by phalanx's e2e tests from the sigs.k8s.io/lws Go
# module, and keep the manifests the tests install next to it, in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/lws/<LWS_VERSION>/
#     lws-manager                     the manager binary (controllers and webhooks)
#     crds/                           the module's config/crd/bases
#     webhook/                        config/webhook/manifests.yaml and its two pod-webhook patches
# Idempotent: does nothing when the pinned version is already there (.built stamp). The version is
# pinned in hack/versions.env. Needs: go (>= 1.26.0), the Go module proxy for a cold build. The
# build log goes to the cache dir, never into the repository.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$CACHE/lws/$LWS_VERSION"
STAMP="$OUT/.built"
WANT="lws=$LWS_VERSION"

if built "$STAMP" "$WANT" "$OUT/lws-manager"; then
  echo "build-lws: $WANT already built in $OUT"
  exit 0
fi

go_env
start_build "$OUT" "$WANT"

# The manager's main package is sigs.k8s.io/lws/cmd; the module has no replace directives, but a
# throwaway module keeps the build independent of the module's own test dependencies.
module_dir sigs.k8s.io/lws "$LWS_VERSION"
[[ -d "$MOD_DIR/config/crd/bases" ]] || fail "no config/crd/bases in sigs.k8s.io/lws@$LWS_VERSION"
build_main sigs.k8s.io/lws "$LWS_VERSION" sigs.k8s.io/lws/cmd lws-manager \
  "-X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"

rm -rf "$OUT/crds" "$OUT/webhook"
mkdir -p "$OUT/crds" "$OUT/webhook"
cp "$MOD_DIR"/config/crd/bases/*.yaml "$OUT/crds/"
cp "$MOD_DIR"/config/webhook/manifests.yaml "$MOD_DIR"/config/webhook/mutating-patch.yaml \
  "$MOD_DIR"/config/webhook/validating-patch.yaml "$OUT/webhook/"
chmod -R u+w "$OUT/crds" "$OUT/webhook"
mv -f "$WORK/lws-manager" "$OUT/lws-manager"
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
END=$(date +%s)
echo "build-lws: done in $((END - START))s: $(ls "$OUT" | tr '\n' ' ')"
