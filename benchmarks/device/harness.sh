#!/usr/bin/env bash
# The harness on the GPU: the GPU test suite, the default `fusedce-profile` run (timed, its
# folder is examples/default-report), a snapshot run for the memory-timeline example, and the
# correctness smoke. Folders come back as tarballs; each step has its own time limit so a
# hang costs one step, not the call.
. benchmarks/device/common.sh
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"
timeout 160 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/ --junitxml="$OUT/gpu_tests.xml" \
  > "$OUT/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"; tail -15 "$OUT/gpu_tests.log"
start=$(date +%s)
timeout --preserve-status -s INT 230 python3 -m fusedce_cli --out /tmp/default-report > /tmp/default.log 2>&1
echo "default run rc=$? wall=$(( $(date +%s) - start ))s" | tee -a /tmp/default.log; tail -25 /tmp/default.log
cp /tmp/default.log /tmp/default-report/ 2>/dev/null
timeout --preserve-status -s INT 80 python3 -m fusedce_cli grid --preset user-gpt --tokens 8192 --backend torch \
  --backend fusedce --snapshot --out /tmp/timeline-report > /tmp/timeline.log 2>&1; echo "timeline rc=$?"; tail -8 /tmp/timeline.log
tar czf "$OUT/default-report.tgz" -C /tmp default-report
tar czf "$OUT/timeline-report.tgz" -C /tmp timeline-report
timeout 60 python3 benchmarks/gpu_smoke.py --out "$OUT" > /tmp/smoke.log 2>&1; echo "smoke rc=$?"; tail -12 /tmp/smoke.log
