#!/usr/bin/env bash
# One GPU: the vocabulary-parallel loss at world size 1 against the plain fused loss
# (peak bytes per phase, step time, differences). DRY=1 runs it on the CPU with tiny shapes.
. benchmarks/device/common.sh
timeout 420 python3 benchmarks/vocab_parallel_world1.py --out "$OUT" 2>&1 | tee "$OUT/vocab_parallel_world1.log" | tail -30
