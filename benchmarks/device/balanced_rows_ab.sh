#!/usr/bin/env bash
# Balanced row chunks against the largest ones (benchmarks/balanced_rows_ab.py), bf16 and fp32 hidden, raw results in $OUT.
# Usage on the device, from the repository root: bash benchmarks/device/balanced_rows_ab.sh
source "$(dirname "$0")/common.sh"
status=0
for dtype in bfloat16 float32; do
  timeout 200 python3 benchmarks/balanced_rows_ab.py --out "$OUT" --hidden-dtype "$dtype" 2>&1 | grep -v Warning \
    | tee -a "$OUT/balanced-rows-ab.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
exit "$status"
