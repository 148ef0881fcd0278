#!/usr/bin/env bash
# Fetch cluster-autoscaler's ProvisioningRequest CRD (provisioningrequests.autoscaling.x-k8s.io)
# from the Go module k8s.io/autoscaler/cluster-autoscaler/apis at the version pinned in
# hack/versions.env (AUTOSCALER_APIS_VERSION), into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/provisioning-crd/<AUTOSCALER_APIS_VERSION>/
#     autoscaling.x-k8s.io_provisioningrequests.yaml
# and print that file's path (the e2e tests install it; docs/autoscaling.md). Idempotent: does
# nothing but print the path when the pinned version is already there. Needs: go, the Go module
# proxy for a cold fetch. Messages go to stderr, the path alone to stdout.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

MODULE=k8s.io/autoscaler/cluster-autoscaler/apis
FILE=autoscaling.x-k8s.io_provisioningrequests.yaml
OUT="$CACHE/provisioning-crd/$AUTOSCALER_APIS_VERSION"

if [[ ! -s "$OUT/$FILE" ]]; then
  go_env
  mkdir -p "$OUT"
  LOG="$OUT/fetch.log"
  : >"$LOG"
  echo "fetch-provisioning-crd: $MODULE@$AUTOSCALER_APIS_VERSION into $OUT" >&2
  module_dir "$MODULE" "$AUTOSCALER_APIS_VERSION" >&2
  [[ -f "$MOD_DIR/config/crd/$FILE" ]] || fail "no config/crd/$FILE in $MODULE@$AUTOSCALER_APIS_VERSION"
  cp "$MOD_DIR/config/crd/$FILE" "$OUT/$FILE.tmp"
  chmod u+w "$OUT/$FILE.tmp"
  mv -f "$OUT/$FILE.tmp" "$OUT/$FILE"
fi
echo "$OUT/$FILE"
