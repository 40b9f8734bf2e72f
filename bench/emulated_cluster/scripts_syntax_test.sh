#!/usr/bin/env bash
# The emulated cluster's scripts parse: bash -n for every shell script,
# Python's compile for every Python one. Nothing is run (the bench itself
# needs root, network namespaces and minutes: not part of CI).
set -euo pipefail
dir="$(dirname "$0")"
n=0
for f in "$dir"/*.sh; do
  bash -n "$f"
  n=$((n + 1))
done
for f in "$dir"/*.py; do
  [ -e "$f" ] || continue
  /usr/bin/python3 -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' "$f"
  n=$((n + 1))
done
# run.sh, probe_link.py and this file at least.
[ "$n" -ge 3 ] || { echo "only $n scripts found in $dir" >&2; exit 1; }
echo "$n scripts parse"
