#!/usr/bin/env bash
# Three questions the frontier left (benchmarks/NOTES.md, design 23), one call, raw results in $OUT:
# - where a step's time goes at the user's head, the default against "fast", amp and bf16 (host_profile.py);
# - whether the peak over the memory model is the caching allocator's whole blocks, and "min" with and without
#   the planner's slack for them (allocator_slack_ab.py);
# - the soft-capped Gemma-2 head in amp on three more seeds: fusedce's grad_h error against eager's.
# Usage on the device, from the repository root: bash benchmarks/device/frontier_followups.sh
source "$(dirname "$0")/common.sh"
head=8192x768x32777
python3 benchmarks/host_profile.py --out "$OUT/host-profile.json" --repeats 21 --top 25 \
  --cases $head:bf16:default $head:bf16:fast $head:amp:default $head:amp:fast 2>&1 | grep -v Warning \
  > "$OUT/host-profile.log"
grep -E "ms, host issue" "$OUT/host-profile.log"
python3 benchmarks/allocator_slack_ab.py --out "$OUT/allocator-slack" > "$OUT/allocator-slack.log" 2>&1
grep -E '^\{"slack"' "$OUT/allocator-slack.log" | cut -c1-400
for seed in ${SEEDS:-1 2 3}; do
  python3 benchmarks/frontier.py --out "$OUT/softcap-seed$seed" --seed "$seed" --repeats 5 --budget-s 200 \
    --impls fusedce fusedce_fast fusedce_min liger torch --cases "Gemma-2-2B, soft-cap 30" --mode amp \
    > "$OUT/softcap-seed$seed.log" 2>&1
  grep -E "x256000" "$OUT/softcap-seed$seed.log" | head -8
done
