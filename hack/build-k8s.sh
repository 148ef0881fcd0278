#!/usr/bin/env bash
# Build the control plane used by phalanx's e2e tests from the Kubernetes and etcd Go modules:
# kube-apiserver, kube-controller-manager, kube-scheduler and etcd, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s/<K8S_VERSION>/
# Idempotent: does nothing when the binaries for the pinned versions are already there.
# Versions are pinned in hack/versions.env. Needs: go (>= 1.26.0), network access to the Go
# module proxy for a cold build. Build logs go to the cache dir, never into the repository.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT="$CACHE/k8s/$K8S_VERSION"
STAMP="$OUT/.built"
WANT="k8s=$K8S_VERSION etcd=$ETCD_VERSION"

if built "$STAMP" "$WANT" "$OUT"/{kube-apiserver,kube-controller-manager,kube-scheduler,etcd}; then
  echo "build-k8s: $WANT already built in $OUT"
  exit 0
fi

go_env
start_build "$OUT" "$WANT"
mkdir -p "$WORK/k8s" "$WORK/etcd"

# ---- Kubernetes ---------------------------------------------------------------------------
# shellcheck source=k8s-module.sh
source "$HACK/k8s-module.sh"
k8s_module "$WORK/k8s" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler
LDFLAGS="$(k8s_ldflags)"

for b in kube-apiserver kube-controller-manager kube-scheduler; do
  echo "build-k8s: building $b ..."
  (
    cd "$WORK/k8s"
    echo "== go build $b ==" >>"$LOG"
    go build -p 2 -trimpath -ldflags "$LDFLAGS" -o "$WORK/$b" "k8s.io/kubernetes/cmd/$b" >>"$LOG" 2>&1
  ) || fail "go build $b"
done

# ---- etcd ---------------------------------------------------------------------------------
# The etcd binary's main package is go.etcd.io/etcd/server/v3 itself; its go.mod replaces the
# sibling etcd modules with local paths, so it is built from a throwaway module as well.
cat >"$WORK/etcd/go.mod" <<GOMOD
module phalanx.local/etcdbuild

go 1.26.0

require (
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
	go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
GOMOD
cat >"$WORK/etcd/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
echo "build-k8s: building etcd ..."
(
  cd "$WORK/etcd"
  echo "== go mod tidy (etcd) ==" >>"$LOG"
  go mod tidy >>"$LOG" 2>&1
  echo "== go build etcd ==" >>"$LOG"
  go build -p 2 -trimpath -ldflags "-s -w" -o "$WORK/etcd-bin" go.etcd.io/etcd/server/v3 >>"$LOG" 2>&1
) || fail "go build etcd $ETCD_VERSION"

for b in kube-apiserver kube-controller-manager kube-scheduler; do mv -f "$WORK/$b" "$OUT/$b"; done
mv -f "$WORK/etcd-bin" "$OUT/etcd"
echo "$WANT" >"$STAMP"
rm -rf "$WORK"
END=$(date +%s)
echo "build-k8s: done in $((END - START))s: $(ls "$OUT" | tr '\n' ' ')"
"$OUT/kube-apiserver" --version || true
