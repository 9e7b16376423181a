#!/usr/bin/env bash
# One rank striping over two NICs (RDMACC_IB_RAILS=2, RDMACC_IB_HCA=rxe0,rxe1)
# on BED_HOSTS hosts x BED_RAILS rails: the collective suite with one rank per
# host (every peer striped), then rdmacc-perf --check with two ranks per host
# (shared memory inside a host, striped RDMA between hosts); both rails of
# every host must have carried packets (the devices' own counters), and a
# rank with another rail count is refused by name.
BUILD=$1
source "$(dirname "$0")/lib.sh"
sent() {  # sent NIC packets of every host's rxe<rail>, one number per host
  for h in $(seq 0 $((BED_HOSTS - 1))); do
    rxe-cluster exec "$h" -- cat "/sys/class/infiniband/rxe$1/ports/1/hw_counters/sent_pkts"
  done | tr '\n' ' '
}
# Nothing here tests failure detection: the bed's ACK timeout (lib.sh).
rails=(RDMACC_IB_HCA=rxe0,rxe1 RDMACC_IB_RAILS=2 "$BED_ACK_TIMEOUT")
before0=$(sent 0); before1=$(sent 1)
rc=0; PER_HOST=1 run_job --timeout 600s -- env "${rails[@]}" "$BUILD/tests/rdmacc_collective_tests" || rc=$?
check "collective suite, 1 rank per host striped over 2 rails" $rc
after0=$(sent 0); after1=$(sent 1)
echo "sent packets rxe0: $before0-> $after0; rxe1: $before1-> $after1"
grew=0
read -ra b0 <<<"$before0"; read -ra a0 <<<"$after0"; read -ra b1 <<<"$before1"; read -ra a1 <<<"$after1"
for ((h = 0; h < BED_HOSTS; h++)); do
  # Each rail carried at least a third of what the other did: striped, not spilled.
  d0=$((a0[h] - b0[h])); d1=$((a1[h] - b1[h]))
  ((d0 > 1000 && d1 > 1000 && 3 * d0 > d1 && 3 * d1 > d0)) || grew=1
done
check "both rails of every host carried the traffic" $grew
rc=0
for c in allreduce allgather alltoall sendrecv; do
  PER_HOST=2 run_job --timeout 300s -- env "${rails[@]}" "$BUILD/rdmacc-perf" -c "$c" -b 8 -e 4M -f 16 -n 3 -w 1 --check || rc=$?
done
check "rdmacc-perf --check, 2 ranks per host (shared memory inside, 2 rails between)" $rc
# Host 1 with one rail, host 0 with two: the ranks refuse each other by name.
out=$(PER_HOST=1 run_job --timeout 120s -- env RDMACC_IB_HCA=rxe0,rxe1 \
  sh -c 'r=2; [ "$GROUP_RANK" = 1 ] && r=1; RDMACC_IB_RAILS=$r exec "$0" "$@"' \
  "$BUILD/rdmacc-perf" -b 8 -e 8 -n 1 2>&1); rc=$?
echo "$out" | tail -5
[[ $rc != 0 && $out == *"RDMACC_IB_RAILS=1"*"RDMACC_IB_RAILS=2"* || $rc != 0 && $out == *"RDMACC_IB_RAILS=2"*"RDMACC_IB_RAILS=1"* ]]
check "a rank with another rail count is refused, naming both" $?
finish
