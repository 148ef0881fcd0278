# Sourced after hack/lib.sh by hack/build-k8s.sh and hack/build-tools.sh: a throwaway Go module
# that builds commands of k8s.io/kubernetes at $K8S_VERSION; and by hack/build-plugin.sh for the
# version stamp.
#
# k8s.io/kubernetes replaces its staging modules with local paths, so it cannot be built with
# `go install pkg@version`. The module requires k8s.io/kubernetes and points every staging module
# at its published v0.X.Y release. fail() is lib.sh's; callers set LOG (start_build does).

# k8s_module DIR PKG...: write DIR/go.mod and DIR/tools.go importing PKG... and tidy it.
k8s_module() {
  local dir="$1"; shift
  local staging_version="v0.${K8S_VERSION#v1.}" mod_json gomod go_line staging m p
  mod_json="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>>"$LOG")" \
    || fail "go mod download k8s.io/kubernetes@$K8S_VERSION"
  gomod="$(printf '%s\n' "$mod_json" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$gomod" ]] || fail "no GoMod file for k8s.io/kubernetes@$K8S_VERSION"
  go_line="$(grep -m1 '^go ' "$gomod")"
  staging="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*#\1#p' "$gomod")"
  [[ -n "$staging" ]] || fail "no staging replaces found in $gomod"
  mkdir -p "$dir"
  {
    echo "module phalanx.local/k8sbuild"
    echo
    echo "$go_line"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in $staging; do echo "	$m => $m $staging_version"; done
    echo ")"
  } >"$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } >"$dir/tools.go"
  (
    cd "$dir"
    echo "== go mod tidy (k8s) ==" >>"$LOG"
    go mod tidy >>"$LOG" 2>&1
  ) || fail "go mod tidy for k8s.io/kubernetes@$K8S_VERSION"
}

# k8s_ldflags: the version stamp of a Kubernetes command built at $K8S_VERSION.
k8s_ldflags() {
  local major="${K8S_VERSION#v}" minor="${K8S_VERSION#v*.}" vpkg=k8s.io/component-base/version
  major="${major%%.*}"; minor="${minor%%.*}"
  local flags="-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor"
  flags+=" -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  flags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  echo "$flags"
}
