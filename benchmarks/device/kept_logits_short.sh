#!/usr/bin/env bash
# The short form of kept_logits.sh, for a session with about three minutes of device time left: the
# kept logits' GPU tests (their own, the memory model's peak and parity with eager in
# tests/test_fusedce_gpu.py), then "fast" beside "fast" recomputing by name and torch.compile at the
# Llama-3 and Mistral-NeMo heads in bf16.
#   on the device:  bash benchmarks/device/kept_logits_short.sh
# $OUT: gpu-tests.xml, frontier-bf16/ (frontier.jsonl, .json, .md, environment.json), frontier-bf16.log.
set -u
export PYTHONUNBUFFERED=1
. benchmarks/device/common.sh
timeout 80 python3 -m pytest -q -p no:cacheprovider -rf tests/test_fusedce_kept.py tests/test_fusedce_gpu.py \
  -k "kept or memory_model or once" --junitxml "$OUT/gpu-tests.xml" 2>&1 | tail -8
timeout 75 python3 benchmarks/frontier.py --out "$OUT/frontier-bf16" --mode bf16 --repeats 5 --budget-s 60 \
  --cases Llama-3-8B "Mistral-NeMo, bias" --impls fusedce_fast fusedce_fast_recompute torch_compile 2>&1 \
  | tee "$OUT/frontier-bf16.log" | grep -E '^(==|   )'
