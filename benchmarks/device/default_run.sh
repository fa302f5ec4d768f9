#!/usr/bin/env bash
# The default `fusedce-profile` run (no arguments) timed on the device: RUNS times in a row (the
# first on cold caches, the later ones warm), each output line prefixed with the Unix time it was
# printed, `/usr/bin/time -v` around each, and the parent's steps before the heading timed one by
# one. Everything lands in $OUT/default-run.tar.gz (one folder per run) and $OUT/summary.txt.
# Usage on the device, from the repository root: RUNS=2 bash benchmarks/device/default_run.sh
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-2}
WORK=/tmp/default-run
rm -rf "$WORK" && mkdir -p "$WORK"
stamp() { python3 -u -c 'import sys, time
for line in sys.stdin: sys.stdout.write(f"{time.time():.3f} {line}"); sys.stdout.flush()'; }
for run in $(seq 1 "$RUNS"); do
  dir="$WORK/run$run"
  mkdir -p "$dir"
  date +%s.%N > "$dir/started"
  /usr/bin/time -v -o "$dir/time.txt" python3 -m fusedce_cli --out "$dir/out" 2>&1 | stamp > "$dir/ts.log"
  wall=$(grep 'Elapsed (wall clock)' "$dir/time.txt" | awk '{print $NF}')
  echo "run $run: wall $wall; $(grep -E 'User time|System time|Minor' "$dir/time.txt" | tr -s ' \t' ' ' | paste -sd';')" \
    | tee -a "$OUT/summary.txt"
done
# The parent's steps before the heading, each timed (warm caches).
python3 - <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import time
t0 = time.perf_counter()
marks = []
def mark(name):
    marks.append((name, time.perf_counter()))
import fusedce_cli.app  # noqa: F401
mark("import the CLI")
import torch
mark("import torch")
from fusedce_profile.checks import resolve_device, check_grid_fits
device = resolve_device(None)
mark("resolve the device")
from fusedce_profile.defaults import default_run
run = default_run(device)
mark("default_run (back-end discovery)")
for spec in run.grids:
    spec.validate()
    check_grid_fits(spec, {"hidden": "--hidden", "vocab": "--vocab"})
mark("check the grids fit")
import fusedce_profile.grid_run  # noqa: F401
mark("import the grid runner")
last = t0
for name, at in marks:
    print(f"before the heading: {name}: {at - last:.2f} s")
    last = at
EOF
tar -czf "$OUT/default-run.tar.gz" -C "$WORK" .
