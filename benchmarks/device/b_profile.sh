#!/usr/bin/env bash
# Device call B: the default `fusedce-profile` run (its grid and the example report)
# and a snapshot run for the memory-timeline plot. Folders come back as tarballs.
. benchmarks/device/common.sh
timeout --preserve-status -s INT 420 python3 -m fusedce_cli --out /tmp/default-report 2>&1 | tail -60
timeout --preserve-status -s INT 100 python3 -m fusedce_cli grid --preset user-gpt --tokens 8192 --backend torch \
  --backend fusedce --snapshot --out /tmp/timeline-report 2>&1 | tail -15
tar czf "$OUT/default-report.tgz" -C /tmp default-report
tar czf "$OUT/timeline-report.tgz" -C /tmp timeline-report
