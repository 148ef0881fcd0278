#!/usr/bin/env bash
# hack/timed.sh NAME COMMAND...: run COMMAND and print on stderr how long it took ("time: NAME 123 s"), so a
# CI log says what each build and suite cost (docs/testing.md, "Time budget"); exits as COMMAND does.
set -uo pipefail
name=$1
shift
start=$(date +%s)
"$@"
rc=$?
echo "time: ${name} $(( $(date +%s) - start )) s (exit ${rc})" >&2
exit "$rc"
