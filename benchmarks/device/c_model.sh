#!/usr/bin/env bash
# Device call C: model mode on the user's model, untied and tied, a 200-step
# parity run, and the goal-4 benchmark variants.
. benchmarks/device/common.sh
B=${BATCH:-34}
timeout 170 python3 -m fusedce_cli model --preset user-gpt --untied --batch "$B" --seq 1024 --eval-step --out /tmp/model-untied 2>&1 | tail -30
timeout 120 python3 -m fusedce_cli model --preset user-gpt --tied --batch "$B" --seq 1024 --out /tmp/model-tied 2>&1 | tail -20
timeout 150 python3 -m fusedce_cli parity --preset user-gpt --steps 200 --batch 16 --seq 512 --lr 1e-3 --backend fusedce --out /tmp/parity 2>&1 | tail -20
tar czf "$OUT/model-reports.tgz" -C /tmp model-untied model-tied parity
timeout 130 python3 benchmarks/bench_lce.py --out "$OUT" --ignore-frac 0.3 --impls torch torch_compile fusedce liger 2>&1 | tail -25
