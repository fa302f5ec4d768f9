#!/usr/bin/env bash
# Budgets in numbers against Liger in pure bf16 at the large heads, in one process (benchmarks/frontier.py):
# the default, "min", and memory_budget = 1.25, 1.1 and 1.08 × floor (below the default's one pass, a budget
# in numbers splits the backward), with torch.compile and Liger beside them, at Mistral-NeMo's head, Llama-3's
# at 8192 and at 32768 tokens. $OUT: frontier.jsonl/.json/.md, goals, environment.json, frontier.log.
#   on the device:  bash benchmarks/device/budget_split.sh        (carry .whl for liger)
set -u
. benchmarks/device/common.sh
timeout "${CALL_S:-540}" python3 benchmarks/frontier.py --out "$OUT" --repeats 5 --budget-s "${BUDGET_S:-420}" \
  --mode bf16 --cases "Mistral-NeMo, bias" "Llama-3-8B" "Llama-3-8B, 32k tokens" \
  --impls fusedce liger fusedce_x1_08 fusedce_x1_1 fusedce_min fusedce_x1_25 torch_compile 2>&1 \
  | tee "$OUT/frontier.log" | grep -E '^(==|   |[0-9]+ of)'
exit "${PIPESTATUS[0]}"
