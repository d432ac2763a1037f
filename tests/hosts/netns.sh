#!/usr/bin/env bash
# Several "hosts" on one machine, for testing weft across hosts under MPI:
# each host is a network namespace (its own interface and address on a
# bridge; MPI's traffic between hosts crosses it over TCP) and a UTS
# namespace (its own host name, which is how weft and Open MPI tell hosts
# apart). Needs root, iproute2 and util-linux's unshare.
#
#   netns.sh up PREFIX N OCTET   hosts PREFIX-h1..hN at 10.213.OCTET.2.. on the
#                                bridge PREFIX-br (10.213.OCTET.1, this namespace)
#   netns.sh down PREFIX N       removes them, killing what still runs there (and
#                                whatever a crashed run left)
#   netns.sh agent HOST CMD...   Open MPI's launch agent (mpirun --mca
#                                plm_rsh_agent "netns.sh agent"): runs CMD on
#                                HOST, as ssh would on a real host
#
# The agent reads WEFT_NETNS_PREFIX (the namespaces' prefix) and, to give a
# host a file system of its own at one path, WEFT_NETNS_PRIVATE="HOST:DIR"
# (an empty tmpfs over DIR in a mount namespace of HOST's processes only:
# a directory that is not shared with the other hosts).
set -euo pipefail

cmd=${1:?usage: netns.sh up PREFIX N OCTET | down PREFIX N | agent HOST CMD...}
shift
case "$cmd" in
up)
    prefix=$1 n=$2 octet=$3
    "$0" down "$prefix" "$n"
    ip link add "$prefix-br" type bridge
    ip addr add "10.213.$octet.1/24" dev "$prefix-br"
    ip link set "$prefix-br" up
    for i in $(seq 1 "$n"); do
        ns="$prefix-h$i"
        ip netns add "$ns"
        ip link add "$prefix-v$i" type veth peer name eth0 netns "$ns"
        ip link set "$prefix-v$i" master "$prefix-br" up
        ip -n "$ns" addr add "10.213.$octet.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
    ;;
down)
    prefix=$1 n=$2
    for i in $(seq 1 "$n"); do
        # Whatever still runs there (a daemon whose launcher was lost).
        ip netns pids "$prefix-h$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$prefix-h$i" 2>/dev/null || true
        ip link del "$prefix-v$i" 2>/dev/null || true
    done
    ip link del "$prefix-br" 2>/dev/null || true
    ;;
agent)
    host=$1
    shift
    prefix=${WEFT_NETNS_PREFIX:?set WEFT_NETNS_PREFIX to the prefix given to up}
    private=${WEFT_NETNS_PRIVATE:-}
    mounts=""
    if [ "${private%%:*}" = "$host" ] && [ -n "${private#*:}" ]; then
        mounts="--mount"
        setup="mount -t tmpfs weft-private '${private#*:}' && "
    else
        setup=""
    fi
    # What Open MPI hands ssh is a shell command line: run it the same way.
    exec ip netns exec "$prefix-$host" unshare --uts $mounts /bin/bash -c "hostname '$host' && $setup$*"
    ;;
*)
    echo "netns.sh: unknown command $cmd" >&2
    exit 2
    ;;
esac
