#!/usr/bin/env bash
# The time–memory frontier on the H200 (benchmarks/frontier.py): every ANCHORS row and the
# extra heads (Qwen2.5-7B, Gemma-2 soft-cap 30, Mistral-NeMo with bias), each LM-head loss
# and each fusedce point, most important case first; cases left after 420 s are recorded as
# skipped, and a hard 470 s limit keeps the whole call under 8 minutes.
#   on the device:  bash benchmarks/device/frontier.sh        (carry .whl for liger and cce)
#   on the CPU:     DRY=1 OUT=/tmp/frontier-dry bash benchmarks/device/frontier.sh
# $OUT: frontier.jsonl (raw cells), frontier.json/.md, environment.json, frontier.log,
# nvidia-smi.txt (device only).
set -u
export PYTHONUNBUFFERED=1
if [ "${DRY:-0}" = "1" ]; then
  mkdir -p "$OUT"
  PY=${PYTHON:-python3}
  timeout 470 "$PY" benchmarks/frontier.py --dry --repeats 1 --budget-s 300 --out "$OUT" 2>&1 | tee "$OUT/frontier.log"
  exit "${PIPESTATUS[0]}"
fi
. benchmarks/device/common.sh
timeout 470 python3 benchmarks/frontier.py --out "$OUT" --repeats 5 --budget-s 420 2>&1 | tee "$OUT/frontier.log"
status=${PIPESTATUS[0]}
tail -n 3 "$OUT/frontier.log"
exit "$status"
