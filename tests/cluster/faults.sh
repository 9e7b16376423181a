#!/usr/bin/env bash
# Network faults on the cluster bed, each with its expected behaviour:
#   lossy link      1% loss + reordering on one host's link: every result right
#   short flap      a link down for less than the retry budget
#                   (RDMACC_IB_TIMEOUT x RDMACC_IB_RETRY_CNT): survived
#   long cut        a link down for longer: every rank fails within the
#                   op's timeout naming a rank; after the link is back the
#                   same processes form a new group that works
#   store host cut  the same with the link of host 0 (rank 0 and the store)
#   idle cut        the ranks wait in receives nobody sends (nothing in
#                   flight) when a link is cut: the keep-alive probes fail
#                   them within 10 s, well before their timeout
#   host lost       a whole host's VM killed: every survivor fails in time
# Prints one line per rank and fault with the time to error
# (tests/CMakeLists.txt: cluster.faults).
#
# RDMACC_IB_RETRY_CNT=6 throughout: soft-RoCE (rxe) takes 7, the default (as
# NCCL's), as "retry forever" (its RNR meaning in the spec), so on rxe a
# dead link is never reported by the queue pair and only the operation's
# timeout ends the wait; on real HCAs 7 is 7 retries.
BUILD=$1
source "$(dirname "$0")/lib.sh"
fault=$BUILD/tests/rdmacc_cluster_fault
last=$((BED_HOSTS - 1))
sig() { echo "$BED_CTL/signals.$1"; }
# FAULTS: the steps to run (default all): loss flap cut store idle lost
want() { [[ " ${FAULTS:-loss flap cut store idle lost} " == *" $1 "* ]]; }
await_ready() {  # DIR: until rank 0 says the allreduces run (or 120 s)
  local t=0
  until [[ -e $1/ready ]]; do
    sleep 0.2; t=$((t + 1))
    if ((t > 600)); then echo "no $1/ready after 120 s" >&2; return 1; fi
  done
  return 0
}

if want loss; then
echo "=== lossy link: netem loss 1% delay 1ms reorder 10% on host $last"
rxe-cluster netem "$last" loss 1% delay 1ms reorder 10%
rc=0; run_job --timeout 300s -- "$BUILD/rdmacc-perf" -c allreduce -b 8 -e 1M -f 16 -n 5 -w 1 --check || rc=$?
rxe-cluster netem "$last" off
check "1% loss + reordering: every allreduce right" $rc
fi

if want flap; then
s=$(sig flap); mkdir -p "$s"
echo "=== short flap: host $last's link down for 3 s, retry budget 7 x 2.1 s (RDMACC_IB_TIMEOUT=19)"
ids=$(start_job --timeout 300s -- env RDMACC_IB_TIMEOUT=19 RDMACC_IB_RETRY_CNT=6 "$fault" survive "$s")
if await_ready "$s"; then
  rxe-cluster link "$last" down; sleep 3; rxe-cluster link "$last" up
fi
touch "$s/restored"
rc=0; rxe-cluster wait $ids || rc=$?
check "link down 3 s < retry budget: survived, every result right" $rc
fi

victims=()
want cut && victims+=("$last")
want store && victims+=(0)
for victim in "${victims[@]}"; do
  s=$(sig cut$victim); mkdir -p "$s"
  what="host $victim's link"; ((victim == 0)) && what="host 0's link (rank 0, the store)"
  echo "=== long cut: $what down for 15 s, retry budget 7 x 537 ms, op timeout 20 s"
  ids=$(start_job --timeout 300s -- env RDMACC_IB_RETRY_CNT=6 "$fault" fail "$s")
  if await_ready "$s"; then
    rxe-cluster link "$victim" down; sleep 15; rxe-cluster link "$victim" up
  fi
  touch "$s/restored"
  rc=0; rxe-cluster wait $ids || rc=$?
  check "$what cut: every rank failed in time naming a rank, then a new group worked" $rc
done

if want idle; then
s=$(sig idle); mkdir -p "$s"
echo "=== idle cut: every rank waits in a receive nobody sends, host $last's link cut; op timeout 20 s"
ids=$(start_job --timeout 300s -- env RDMACC_IB_RETRY_CNT=6 RDMACC_TIMEOUT=20s "$fault" idle "$s")
if await_ready "$s"; then
  sleep 1; rxe-cluster link "$last" down; sleep 12; rxe-cluster link "$last" up
fi
rc=0; rxe-cluster wait $ids || rc=$?
check "idle ranks learn of the cut from the keep-alive within 10 s, naming a rank" $rc
fi

if want lost; then
s=$(sig lost); mkdir -p "$s"
echo "=== host lost: host $last's VM killed"
ids=($(start_job --timeout 300s -- env RDMACC_IB_RETRY_CNT=6 "$fault" fail-final "$s"))
if await_ready "$s"; then rxe-cluster kill "$last"; fi
rc=0; rxe-cluster wait "${ids[@]:0:$last}" || rc=$?
check "host $last lost: every survivor failed in time naming a rank" $rc
fi
finish
