#!/usr/bin/env bash
# Build Toxiproxy's server, the TCP proxy phalanx's network-fault tests put between components, from
# the github.com/Shopify/toxiproxy/v2 Go module, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/toxiproxy/<TOXIPROXY_VERSION>/toxiproxy-server
# Idempotent: does nothing when the pinned version is already there (.built stamp). The version is
# pinned in hack/versions.env. Needs: go (>= 1.26.0), the Go module proxy for a cold build. The
# build log goes to the cache dir, never into the repository.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$CACHE/toxiproxy/$TOXIPROXY_VERSION"
STAMP="$OUT/.built"
WANT="toxiproxy=$TOXIPROXY_VERSION"

if built "$STAMP" "$WANT" "$OUT/toxiproxy-server"; then
  echo "build-toxiproxy: $WANT already built in $OUT"
  exit 0
fi

go_env
start_build "$OUT" "$WANT"

# A throwaway module requiring the pinned version keeps the build independent of the module's own
# test dependencies; the server's main package is cmd/server.
module_dir github.com/Shopify/toxiproxy/v2 "$TOXIPROXY_VERSION"
[[ -d "$MOD_DIR/cmd/server" ]] || fail "no cmd/server in github.com/Shopify/toxiproxy/v2@$TOXIPROXY_VERSION"
build_main github.com/Shopify/toxiproxy/v2 "$TOXIPROXY_VERSION" github.com/Shopify/toxiproxy/v2/cmd/server \
  toxiproxy-server "-X github.com/Shopify/toxiproxy/v2.Version=$TOXIPROXY_VERSION"

mv -f "$WORK/toxiproxy-server" "$OUT/toxiproxy-server"
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
END=$(date +%s)
echo "build-toxiproxy: done in $((END - START))s"
