# Sourced first by the hack/ scripts that build Go binaries into the cache: what they all begin
# with. It defines
#   HACK, ROOT  this directory and the repository root (absolute)
#   PROG        the sourcing script's name without .sh, the prefix of its messages
#   CACHE       ${XDG_CACHE_HOME:-$HOME/.cache}/phalanx, below which every build goes
# and the pinned versions of hack/versions.env. Sourcing it writes nothing.

HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HACK/.." && pwd)"
PROG="$(basename "${BASH_SOURCE[1]:-$0}" .sh)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/phalanx"
# shellcheck source=versions.env
source "$HACK/versions.env"

# built STAMP WANT BIN...: true when the file STAMP holds WANT and every BIN is executable.
built() {
  local stamp="$1" want="$2" bin
  shift 2
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] || return 1
  for bin in "$@"; do [[ -x "$bin" ]] || return 1; done
}

# go_env: exit 1 unless go is on PATH; export what every build runs with (the pinned toolchain
# unless GOTOOLCHAIN is set, no VCS stamping, no cgo).
go_env() {
  command -v go >/dev/null || { echo "$PROG: go is not on PATH" >&2; exit 1; }
  export GOTOOLCHAIN="${GOTOOLCHAIN:-$K8S_GOTOOLCHAIN}" GOFLAGS="-buildvcs=false" CGO_ENABLED=0
}

# start_build DIR WHAT: announce the build of WHAT into DIR; set WORK (a fresh, empty DIR/.build),
# LOG (DIR/build.log, emptied) and START (seconds since the epoch).
start_build() {
  mkdir -p "$1"
  WORK="$1/.build"
  LOG="$1/build.log"
  rm -rf "$WORK"
  mkdir -p "$WORK"
  : >"$LOG"
  echo "$PROG: building $2 into $1 (log: $LOG)"
  START=$(date +%s)
}

# fail WHAT...: say which step failed, show the end of LOG and exit 1.
fail() {
  echo "$PROG: FAILED: $*" >&2
  echo "---- last 40 lines of $LOG ----" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}

# module_dir MODULE VERSION: download MODULE@VERSION through the Go module proxy and set MOD_DIR
# to its directory in the module cache (fails with the log's end when it cannot).
module_dir() {
  local json
  json="$(go mod download -json "$1@$2" 2>>"$LOG")" || fail "go mod download $1@$2"
  MOD_DIR="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -f "$MOD_DIR/go.mod" ]] || fail "no go.mod in $1@$2"
}

# build_main MODULE VERSION PACKAGE BIN LDFLAGS: build the main PACKAGE of MODULE@VERSION (MOD_DIR
# set by module_dir) into WORK/BIN, inside a throwaway module that requires only the pinned
# version, so the build does not depend on the module's own test and tooling dependencies.
build_main() {
  local module="$1" version="$2" package="$3" bin="$4" ldflags="$5"
  printf 'module phalanx.local/%sbuild\n\n%s\n\nrequire %s %s\n' "$bin" "$(grep -m1 '^go ' "$MOD_DIR/go.mod")" \
    "$module" "$version" >"$WORK/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$package" >"$WORK/tools.go"
  (
    cd "$WORK"
    echo "== go mod tidy ($bin) ==" >>"$LOG"
    go mod tidy >>"$LOG" 2>&1
    echo "== go build $bin ==" >>"$LOG"
    go build -p 2 -trimpath -ldflags "-s -w $ldflags" -o "$WORK/$bin" "$package" >>"$LOG" 2>&1
  ) || fail "go build $package@$version"
}
