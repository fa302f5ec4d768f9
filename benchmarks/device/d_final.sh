#!/usr/bin/env bash
# Device call D: the side-by-side benchmark after the buffer-reuse change, the all-options
# variant (goal 4), the model-mode GPU tests, and --fit on the user's model.
. benchmarks/device/common.sh
timeout 170 python3 benchmarks/bench_lce.py --out "$OUT" --tag final 2>&1 | tail -45
timeout 100 python3 benchmarks/bench_lce.py --out "$OUT" --all-options --impls torch torch_compile fusedce liger 2>&1 | tail -30
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_model_gpu.py 2>&1 | tail -8
timeout 90 python3 -m fusedce_cli model --preset user-gpt --untied --batch 32 --seq 1024 --backend torch --backend fusedce \
  --fit 24 --fit-max 96 --out /tmp/model-fit 2>&1 | tail -15
tar czf "$OUT/model-fit.tgz" -C /tmp model-fit
