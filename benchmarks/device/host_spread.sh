#!/usr/bin/env bash
# The host-spread probe (benchmarks/host_spread.py) in two processes of one call; run it in two
# calls (two machines) to separate a slower host from the spread between processes.
#   on the device:  CALL=a bash benchmarks/device/host_spread.sh      ($OUT: host-spread-a1.json, -a2.json, .log)
. "$(dirname "$0")/common.sh"
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | tee "$OUT/lscpu-${CALL:-a}.txt"
for k in 1 2; do
  timeout 240 python3 benchmarks/host_spread.py --out "$OUT/host-spread-${CALL:-a}$k.json" --rounds 2 2>&1 \
    | grep -v Warning | tee -a "$OUT/host-spread-${CALL:-a}.log"
done
