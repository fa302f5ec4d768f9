# Sourced by the device scripts that run several steps under one time budget: `step NAME LIMIT
# CMD...` runs CMD with its output appended to $LOG, under `timeout` at LIMIT seconds or what is
# left of $BUDGET (less $TAR_MARGIN for packing), whichever is smaller; a step with under 20 s
# left is skipped, and so is one not named in $STEPS (default: all). Each start, exit status and
# duration goes to $LOG and the terminal, so a cut step is visible and the next one still runs.
STEPS=${STEPS:-all}
step() {
  local name=$1 limit=$2; shift 2
  if [ "$STEPS" != all ] && [[ " $STEPS " != *" $name "* ]]; then echo "== $name: not in STEPS" | tee -a "$LOG"; return 0; fi
  local left=$(( BUDGET - SECONDS - TAR_MARGIN ))
  if (( left < limit )); then limit=$left; fi
  if (( limit < 20 )); then echo "== $name: skipped, ${left} s left" | tee -a "$LOG"; return 0; fi
  echo "== $name: start at ${SECONDS} s, limit ${limit} s: $*" | tee -a "$LOG"
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  echo "== $name: exit $? after $(( SECONDS - start )) s (124: cut by the limit)" | tee -a "$LOG"
}
