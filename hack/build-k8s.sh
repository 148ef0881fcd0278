#!/usr/bin/env bash
# Build the control plane used by phalanx's e2e tests from the Kubernetes and etcd Go modules:
# kube-apiserver, kube-controller-manager, kube-scheduler and etcd, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s/<K8S_VERSION>/
# Idempotent: does nothing when the binaries for the pinned versions are already there.
# Versions are pinned in hack/versions.env. Needs: go (>= 1.26.0), network access to the Go
# module proxy for a cold build. Build logs go to the cache dir, never into the repository.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s"
OUT="$CACHE_ROOT/$K8S_VERSION"
STAMP="$OUT/.built"
WANT="k8s=$K8S_VERSION etcd=$ETCD_VERSION"
BINS=(kube-apiserver kube-controller-manager kube-scheduler etcd)

have_all() {
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] || return 1
  local b
  for b in "${BINS[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done
}

if have_all; then
  echo "build-k8s: $WANT already built in $OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-k8s: go is not on PATH" >&2; exit 1; }
export GOTOOLCHAIN="${GOTOOLCHAIN:-$K8S_GOTOOLCHAIN}"
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

mkdir -p "$OUT"
WORK="$OUT/.build"
LOG="$OUT/build.log"
rm -rf "$WORK"
mkdir -p "$WORK/k8s" "$WORK/etcd"
: >"$LOG"
echo "build-k8s: building $WANT into $OUT (log: $LOG)"
START=$(date +%s)

fail() {
  echo "build-k8s: FAILED: $*" >&2
  echo "---- last 40 lines of $LOG ----" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}

# ---- Kubernetes ---------------------------------------------------------------------------
# k8s.io/kubernetes replaces its staging modules with local paths, so it cannot be built with
# `go install pkg@version`. Build it from a throwaway module that requires k8s.io/kubernetes and
# points every staging module at its published v0.X.Y release.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
K8S_MOD_JSON="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>>"$LOG")" \
  || fail "go mod download k8s.io/kubernetes@$K8S_VERSION"
K8S_GOMOD="$(printf '%s\n' "$K8S_MOD_JSON" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[[ -f "$K8S_GOMOD" ]] || fail "no GoMod file for k8s.io/kubernetes@$K8S_VERSION"
GO_LINE="$(grep -m1 '^go ' "$K8S_GOMOD")"
STAGING="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*#\1#p' "$K8S_GOMOD")"
[[ -n "$STAGING" ]] || fail "no staging replaces found in $K8S_GOMOD"

{
  echo "module phalanx.local/k8sbuild"
  echo
  echo "$GO_LINE"
  echo
  echo "require k8s.io/kubernetes $K8S_VERSION"
  echo
  echo "replace ("
  for m in $STAGING; do echo "	$m => $m $STAGING_VERSION"; done
  echo ")"
} >"$WORK/k8s/go.mod"
cat >"$WORK/k8s/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO

MAJOR="${K8S_VERSION#v}"; MAJOR="${MAJOR%%.*}"
MINOR="${K8S_VERSION#v*.}"; MINOR="${MINOR%%.*}"
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
VPKG=k8s.io/component-base/version
LDFLAGS="-s -w -X $VPKG.gitVersion=$K8S_VERSION -X $VPKG.gitMajor=$MAJOR -X $VPKG.gitMinor=$MINOR"
LDFLAGS+=" -X $VPKG.gitTreeState=clean -X $VPKG.buildDate=$BUILD_DATE"
LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"

(
  cd "$WORK/k8s"
  echo "== go mod tidy (k8s) ==" >>"$LOG"
  go mod tidy >>"$LOG" 2>&1
) || fail "go mod tidy for k8s.io/kubernetes@$K8S_VERSION"

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
