#!/usr/bin/env bash
# Command one's table (scripts/demo.sh) from two sets of binaries, run
# alternately (before, after, before, ...) so that a slow spell of a shared
# machine falls on both; prints every run's table and, per strategy, the
# median of the measured and modeled columns, before and after, and their
# ratio. Each directory holds server/hsapd and client/demo/hsap_demo (a
# bazel-bin, or copies of another commit's). Extra arguments go to
# hsap_demo.
#
#   bash scripts/demo_before_after.sh /tmp/before-bin /tmp/after-bin 3 --packs=1
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_BIN AFTER_BIN [ROUNDS] [hsap_demo args...]" >&2
  exit 2
fi
before=$1 after=$2
shift 2
rounds=3
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
for dir in "$before" "$after"; do
  for bin in server/hsapd client/demo/hsap_demo; do
    [ -x "$dir/$bin" ] || { echo "$dir/$bin: not an executable" >&2; exit 2; }
  done
done
out=$(mktemp -d /tmp/hsap-demo-ba.XXXXXX)
trap 'rm -rf "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  for side in before after; do
    dir=$before
    [ $side = after ] && dir=$after
    echo "=== round $r, $side ($dir)"
    if ! HSAP_DEMO_BIN="$dir" bash scripts/demo.sh "$@" >"$out/$side.$r.txt" 2>&1; then
      tail -n 30 "$out/$side.$r.txt"
      echo "demo_before_after: the $side run of round $r failed" >&2
      exit 1
    fi
    grep -E '^(strategy|ring|ulysses|usp|sap|hsap|auto) |^CHECK' "$out/$side.$r.txt"
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
cols = {}
for side in ("before", "after"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}.txt"):
            f = line.split()
            if len(f) == 6 and f[0] in ("ring", "ulysses", "usp", "sap", "hsap", "auto"):
                cols.setdefault((f[0], side), []).append((float(f[3]), float(f[4])))
print(f"median of {rounds} runs each, alternating")
print(f"{'strategy':9} {'measured before':>15} {'after':>9} {'after/before':>12}"
      f" {'modeled before':>15} {'after':>9}")
for s in ("ring", "ulysses", "usp", "sap", "hsap", "auto"):
    b, a = cols.get((s, "before")), cols.get((s, "after"))
    if not b or not a:
        continue
    mb, ma = statistics.median(x[0] for x in b), statistics.median(x[0] for x in a)
    pb, pa = statistics.median(x[1] for x in b), statistics.median(x[1] for x in a)
    print(f"{s:9} {mb:15.1f} {ma:9.1f} {ma / mb:12.3f} {pb:15.1f} {pa:9.1f}")
PY
