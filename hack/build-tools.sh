#!/usr/bin/env bash
# Build the client tools phalanx's install tests use, from the Go modules, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/tools/kubectl-<K8S_VERSION>/kubectl
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/tools/helm-<HELM_VERSION>/helm
#   ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/tools/krew-<KREW_VERSION>/krew
# kubectl comes from k8s.io/kubernetes at the control plane's version, helm from helm.sh/helm/v3,
# krew from sigs.k8s.io/krew.
# Idempotent: a tool whose stamp matches its pinned version is not rebuilt. Versions are pinned in
# hack/versions.env. Needs: go (>= 1.26.0), network access to the Go module proxy for a cold
# build. Build logs go to the cache dir, never into the repository.
set -euo pipefail

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=k8s-module.sh
source "$HACK/k8s-module.sh"

CACHE_ROOT="$CACHE/tools"

finish_build() {  # finish_build DIR NAME WANT
  mv -f "$WORK/$2" "$1/$2"
  echo "$3" >"$1/.built"
  rm -rf "$WORK"
  echo "build-tools: $3 done in $(($(date +%s) - START))s"
}

go_env

# ---- kubectl: the same throwaway module as the control plane ----------------------------------
KUBECTL_DIR="$CACHE_ROOT/kubectl-$K8S_VERSION"
if built "$KUBECTL_DIR/.built" "kubectl=$K8S_VERSION" "$KUBECTL_DIR/kubectl"; then
  echo "build-tools: kubectl=$K8S_VERSION already built in $KUBECTL_DIR"
else
  start_build "$KUBECTL_DIR" "kubectl=$K8S_VERSION"
  k8s_module "$WORK/k8s" k8s.io/kubernetes/cmd/kubectl
  (
    cd "$WORK/k8s"
    echo "== go build kubectl ==" >>"$LOG"
    go build -p 2 -trimpath -ldflags "$(k8s_ldflags)" -o "$WORK/kubectl" k8s.io/kubernetes/cmd/kubectl >>"$LOG" 2>&1
  ) || fail "go build kubectl"
  finish_build "$KUBECTL_DIR" kubectl "kubectl=$K8S_VERSION"
fi

# ---- helm: its go.mod has no replace directives, so `go install pkg@version` builds it ----------
HELM_DIR="$CACHE_ROOT/helm-$HELM_VERSION"
if built "$HELM_DIR/.built" "helm=$HELM_VERSION" "$HELM_DIR/helm"; then
  echo "build-tools: helm=$HELM_VERSION already built in $HELM_DIR"
else
  start_build "$HELM_DIR" "helm=$HELM_VERSION"
  # helm stamps its own version and the Kubernetes minor its linter and `helm template` assume;
  # the latter is read from the k8s.io/client-go release helm requires.
  HELM_GOMOD="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" 2>>"$LOG" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')" || fail "go mod download helm.sh/helm/v3@$HELM_VERSION"
  [[ -f "$HELM_GOMOD" ]] || fail "no GoMod file for helm.sh/helm/v3@$HELM_VERSION"
  CLIENT_GO="$(sed -n 's#^[[:space:]]*k8s\.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$HELM_GOMOD" | head -1)"
  [[ -n "$CLIENT_GO" ]] || fail "no k8s.io/client-go requirement in $HELM_GOMOD"
  HPKG=helm.sh/helm/v3
  HELM_LDFLAGS="-s -w -X $HPKG/internal/version.version=$HELM_VERSION -X $HPKG/internal/version.gitTreeState=clean"
  HELM_LDFLAGS+=" -X $HPKG/pkg/lint/rules.k8sVersionMajor=1 -X $HPKG/pkg/lint/rules.k8sVersionMinor=$CLIENT_GO"
  HELM_LDFLAGS+=" -X $HPKG/pkg/chartutil.k8sVersionMajor=1 -X $HPKG/pkg/chartutil.k8sVersionMinor=$CLIENT_GO"
  (
    echo "== go install helm ==" >>"$LOG"
    GOBIN="$WORK" go install -p 2 -trimpath -ldflags "$HELM_LDFLAGS" "$HPKG/cmd/helm@$HELM_VERSION" >>"$LOG" 2>&1
  ) || fail "go install helm $HELM_VERSION"
  finish_build "$HELM_DIR" helm "helm=$HELM_VERSION"
fi
# ---- krew: no replace directives either; its version stamped as its release does --------------
KREW_DIR="$CACHE_ROOT/krew-$KREW_VERSION"
if built "$KREW_DIR/.built" "krew=$KREW_VERSION" "$KREW_DIR/krew"; then
  echo "build-tools: krew=$KREW_VERSION already built in $KREW_DIR"
else
  start_build "$KREW_DIR" "krew=$KREW_VERSION"
  KPKG=sigs.k8s.io/krew
  (
    echo "== go install krew ==" >>"$LOG"
    GOBIN="$WORK" go install -p 2 -trimpath -ldflags "-s -w -X $KPKG/internal/version.gitTag=$KREW_VERSION" \
      "$KPKG/cmd/krew@$KREW_VERSION" >>"$LOG" 2>&1
  ) || fail "go install krew $KREW_VERSION"
  finish_build "$KREW_DIR" krew "krew=$KREW_VERSION"
fi
"$KUBECTL_DIR/kubectl" version --client
"$HELM_DIR/helm" version --short
"$KREW_DIR/krew" version | grep -m1 GitTag || true
