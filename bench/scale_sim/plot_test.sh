#!/usr/bin/env bash
# The simulator end to end on a tiny grid: scale_sim writes its TSV,
# plot.py draws both figures (PNG and SVG) from it, twice, byte for byte
# the same. Needs Debian's python3-matplotlib (scripts/install_deps.sh).
set -euo pipefail
sim="$1" plot="$2"
out="${TEST_TMPDIR:-$(mktemp -d)}"
"$sim" --nodes=1,2 --tokens=8192,16384 --packs=1 --heads=8 --kv_heads=2 --head_dim=64 \
  --out="$out/sim.tsv" >"$out/sim.txt"
# 2 T x 2 node counts x (7 strategies + 3 floors) rows + header.
lines=$(wc -l <"$out/sim.tsv")
[ "$lines" -eq 41 ] || { echo "sim.tsv has $lines lines, want 41" >&2; exit 1; }
grep -q "T = 16384, 2 nodes x 8 = 16 GPUs, 1 packs" "$out/sim.txt"
/usr/bin/python3 "$plot" "$out/sim.tsv" "$out/a"
/usr/bin/python3 "$plot" "$out/sim.tsv" "$out/b"
for f in scale_time.png scale_time.svg scale_bytes.png scale_bytes.svg; do
  [ -s "$out/a/$f" ] || { echo "$f missing or empty" >&2; exit 1; }
  cmp "$out/a/$f" "$out/b/$f"
done
echo "plots written and reproducible"
