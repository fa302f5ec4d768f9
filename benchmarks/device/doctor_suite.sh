#!/usr/bin/env bash
# Device run "doctor suite" (one H200, ≤ 150 s): every doctor check's planted mistake and the correct
# wiring, under bf16 autocast and in fp32 (benchmarks/device/doctor_suite.py; V=8192, H=512, 8×256
# tokens; torch.compile with inductor for the compile check). Files in $OUT/doctor: results.json (raw
# rows), table.md, doctor_suite.log. Exit 1 when a run is wrong (a planted mistake passing its check,
# or a correct wiring failing).
# Dry run on the CPU (tiny sizes): DRY=1 OUT=/tmp/dry bash benchmarks/device/doctor_suite.sh
set -u
if [ "${DRY:-0}" = "1" ]; then
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  FLAGS=(--tiny --device cpu)
else
  . benchmarks/device/common.sh
  FLAGS=(--device cuda)
fi
mkdir -p "$OUT/doctor"
timeout 170 python3 benchmarks/device/doctor_suite.py --out "$OUT/doctor" --budget "${BUDGET:-130}" "${FLAGS[@]}" \
  2>&1 | grep -v '^USDT:' | tee "$OUT/doctor/doctor_suite.log"
exit "${PIPESTATUS[0]}"
