#!/bin/sh
# The device's asynchronous events reach rdmacc: the netdev under the RDMA
# device goes down for half a second while two ranks run allreduces over
# RDMA. Each rank logs IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE (read by
# the progress engine), and the run ends in time either way: right results
# where the device retries through the gap, or (soft-RoCE, which fails the
# writes it cannot route with "local QP operation error") an error on every
# rank naming its peer. Needs root (ip link) on the machine with the device:
# the soft-RoCE VM. Arguments: the build directory.
set -u
build=$1
dev=$("$build/rdmacc-info" --json 2>/dev/null | python3 -c "import json,sys; print((json.load(sys.stdin)['endpoint'] or {}).get('device', ''))")
netdev=$(rdma link show "$dev/1" 2>/dev/null | sed -n 's/.*netdev \([^ ]*\).*/\1/p')
[ -n "$netdev" ] || { echo "port_events: no netdev under '$dev'"; exit 1; }
log=$(mktemp)
RDMACC_TRANSPORT=rdma RDMACC_LOG_LEVEL=info "$build/rdmacc-run" -n 2 --timeout 120s -- \
  "$build/rdmacc-perf" -b 64K -e 64K -n 10000 -w 10 --check > "$log" 2>&1 &
job=$!
sleep 3
ip link set "$netdev" down
sleep 0.5
ip link set "$netdev" up
wait $job; st=$?
ip link set "$netdev" up
grep -E "went down|active again|Out of bounds|error" "$log"
fail=0
if [ $st -ne 0 ] && [ "$(grep -c "is broken: .*\[peer rank [01] " "$log")" -lt 2 ]; then
  echo "port_events: the run failed (status $st) without an error naming the peer on both ranks"; fail=1
fi
[ "$(grep -c 'went down' "$log")" -ge 1 ] || { echo "port_events: no rank logged the port going down"; fail=1; }
[ "$(grep -c 'active again' "$log")" -ge 1 ] || { echo "port_events: no rank logged the port coming back"; fail=1; }
rm -f "$log"
exit $fail
