#!/usr/bin/env bash
# Logits kept from the forward (fusedce/kept_plan.py), on the device, in one call: (a) the loss's GPU test
# files (parity with eager, determinism, the memory model's peak), the kept logits' own tests compiled and
# the logits detector's; (b) the bf16 frontier with "fast" beside "fast" recomputing by name (the
# plan before logits were kept: nothing held from the forward, wide blocks), every peer in one process.
#   on the device:  bash benchmarks/device/kept_logits.sh        (carry .whl for liger and cce)
# $OUT: frontier-bf16/ (frontier.jsonl, .json, .md, environment.json), frontier-bf16.log, gpu-tests.xml.
set -u
export PYTHONUNBUFFERED=1
. benchmarks/device/common.sh
timeout 100 python3 benchmarks/frontier.py --out "$OUT/frontier-bf16" --mode bf16 --repeats 5 --budget-s 90 \
  --cases Llama-3-8B "Mistral-NeMo, bias" --impls fusedce torch_compile fusedce_fast fusedce_fast_recompute \
  fusedce_min liger 2>&1 | tee "$OUT/frontier-bf16.log" | grep -E '^(==|   )'
timeout 250 python3 -m pytest -q -p no:cacheprovider -rf tests/test_fusedce_kept.py tests/test_fusedce_gpu.py \
  tests/test_fusedce_tiles.py tests/test_trace.py --junitxml "$OUT/gpu-tests.xml" 2>&1 | tail -12
