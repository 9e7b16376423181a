#!/bin/sh
# rdmacc-run stops what a rank leaves running (each rank is a session of its
# own, stopped as a process group, as torchrun's workers are): a background
# child that holds the rank's output must not keep the launcher waiting, and
# no process may outlive the job, whether it ended well or a rank failed.
# Usage: run_stops_leftovers.sh RDMACC-RUN
set -eu
run=$1
# A duration no other process on the machine sleeps for: how leftovers are found.
mark=$((700000 + $$ % 100000))
left() { pgrep -f "sleep $mark\$" > /dev/null; }
fail() { echo "run_stops_leftovers: $*" >&2; pkill -f "sleep $mark\$" || true; exit 1; }

# 1. Every rank exits 0 at once, leaving a child that holds stdout. The
# hang guard (timeout) is far above the launcher's 5 s grace.
st=0
timeout 60 "$run" -n 2 -- sh -c "sleep $mark & echo started" > out.txt || st=$?
[ "$st" = 0 ] || fail "a clean run with a background child: status $st (124: the launcher waited for it)"
[ "$(grep -c started out.txt)" = 2 ] || fail "the ranks' output is missing: $(cat out.txt)"
! left || fail "a rank's background child outlived a clean run"

# 2. Rank 1 fails while rank 0 and its child run: both go, and the
# launcher exits with rank 1's status.
st=0
timeout 60 "$run" -n 2 -- sh -c "if [ \$RANK = 1 ]; then exit 3; fi; sleep $mark & wait" \
  > /dev/null 2> err.txt || st=$?
[ "$st" = 3 ] || fail "a failed run: status $st, want 3 (rank 1's): $(cat err.txt)"
grep -q "rank 1 exited with status 3" err.txt || fail "the failing rank is not named: $(cat err.txt)"
! left || fail "rank 0's child outlived a failed run"
echo "run_stops_leftovers: ok"
