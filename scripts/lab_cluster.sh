#!/usr/bin/env bash
# A cluster of hosts on this machine: one Linux network + UTS namespace per host, joined by a
# bridge over shaped links, for running adpsgd jobs across real network links (docs/lab.md).
#
#   scripts/lab_cluster.sh up N [RATE]     hosts lab1..labN, every link shaped to RATE (1gbit)
#   scripts/lab_cluster.sh down            remove everything `up` made, and the shared
#                                          memory of ranks killed on the hosts
#   scripts/lab_cluster.sh status          the hosts, their addresses, links and rates
#   scripts/lab_cluster.sh rate HOST RATE  reshape one host's link while a job runs
#   scripts/lab_cluster.sh link HOST down|up   cut a host's link, or mend it
#   scripts/lab_cluster.sh ssh [OPTIONS] HOST COMMAND...   run COMMAND on HOST, as ssh would
#
# Each host has its own network stack (one interface, eth0, with a private address), its own
# hostname, and a veth pair to the bridge on the head (this machine's own namespace, which
# runs mpiexec or slurmctld). RATE is tc's syntax (1gbit, 100mbit, 500kbit); a token bucket
# (tbf) shapes both directions of each host's link, so two hosts exchange at most RATE each
# way. Latency cannot be added (netem is missing on this kernel), so the links are fast
# short-haul ones: what a job meets here is bandwidth, not distance.
#
# Hosts are entered as a cluster's ssh would enter them: `lab_cluster.sh ssh HOST CMD` runs
# CMD in the host's namespaces, with /etc/netns/HOST/hosts as its /etc/hosts (every lab host
# and the head by name); `up` writes $LAB_DIR/ssh, an executable that does just that, for
# mpiexec's -launcher-exec. A host whose link is down does not answer (exit 255, as ssh).
# All hosts share this machine's kernel, so UCX would see one machine and use shared memory
# between them; the entry sets UCX_TLS=tcp,self so that MPI traffic crosses the links (ranks
# of one host still share memory through MPICH's own shm).
#
# Names and addresses: LAB_PREFIX (lab) names the hosts, LAB_SUBNET (10.213.0) holds
# their addresses (.1..N; the head is .254), LAB_DIR (/run/adpsgd-lab) holds the hostfile,
# the ssh entry and the UTS namespaces. `up` is idempotent and repairs a half-made lab (after
# a Ctrl-C or a crash); its last line prints the adpsgd-run overrides for the lab.
set -euo pipefail

PREFIX=${LAB_PREFIX:-lab}
SUBNET=${LAB_SUBNET:-10.213.0}
DIR=${LAB_DIR:-/run/adpsgd-lab}
BRIDGE=${PREFIX}br0
HEAD_IP=$SUBNET.254
SELF=$(readlink -f "$0")
. "$(dirname "$SELF")/shm_segments.sh"

say() { echo "lab_cluster: $*"; }
die() { echo "lab_cluster: error: $*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "network namespaces need root: run it as root (sudo $0 $*)"
    local tool
    for tool in ip tc nsenter unshare; do
        command -v "$tool" >/dev/null || die "$tool is missing (Debian: apt-get install iproute2 util-linux)"
    done
}

hosts() {  # the lab's hosts, in order
    [ -f "$DIR/hosts" ] && cat "$DIR/hosts" || true
}

host_index() { echo "${1#"$PREFIX"}"; }

valid_rate() {  # a tc rate: digits and a unit
    [[ "$1" =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$ ]]
}

rate_bits() {  # tc's rate as bits per second
    local n=${1%%[a-z]*} unit=${1##*[0-9.]}
    case "$unit" in
        bit) echo "$n" | awk '{printf "%d", $1}' ;;
        kbit) echo "$n" | awk '{printf "%d", $1 * 1e3}' ;;
        mbit) echo "$n" | awk '{printf "%d", $1 * 1e6}' ;;
        gbit) echo "$n" | awk '{printf "%d", $1 * 1e9}' ;;
        tbit) echo "$n" | awk '{printf "%d", $1 * 1e12}' ;;
        bps) echo "$n" | awk '{printf "%d", $1 * 8}' ;;
        kbps) echo "$n" | awk '{printf "%d", $1 * 8e3}' ;;
        mbps) echo "$n" | awk '{printf "%d", $1 * 8e6}' ;;
        gbps) echo "$n" | awk '{printf "%d", $1 * 8e9}' ;;
    esac
}

shape() {  # shape HOST RATE: a token bucket on both ends of the host's link
    local host=$1 rate=$2 bits burst
    bits=$(rate_bits "$rate")
    # A burst of 4 ms at the rate, at least 64 kB: a segmentation-offloaded packet (up to
    # 64 kB) must fit the bucket, or tbf drops it.
    burst=$(( bits / 8 / 250 ))
    [ "$burst" -ge 65536 ] || burst=65536
    tc qdisc replace dev "$host-h" root tbf rate "$rate" burst "$burst" latency 50ms
    ip netns exec "$host" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    echo "$rate" > "$DIR/$host.rate"
}

write_hosts_files() {  # /etc/netns/HOST/hosts: every host and the head, by name
    local host entries
    entries="127.0.0.1 localhost"$'\n'"$HEAD_IP $(hostname) ${PREFIX}head"
    for host in $(hosts); do
        entries+=$'\n'"$SUBNET.$(host_index "$host") $host"
    done
    for host in $(hosts); do
        mkdir -p "/etc/netns/$host"
        printf '%s\n' "$entries" > "/etc/netns/$host/hosts"
        # No name server answers inside a host: a lookup the hosts file misses (torch's
        # TCPStore asks for the name of ::ffff:10.213.0.2) is refused at once on the host's
        # loopback, where this machine's server, unreachable from here, took 10 s to time out.
        printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' > "/etc/netns/$host/resolv.conf"
    done
    hosts > "$DIR/hostfile"
}

write_entry() {  # $DIR/ssh: the command that enters a host, for mpiexec's -launcher-exec
    cat > "$DIR/ssh" <<EOF
#!/bin/sh
# Enters a host of the lab as ssh would (written by $SELF up).
LAB_PREFIX=$PREFIX LAB_SUBNET=$SUBNET LAB_DIR=$DIR exec "$SELF" ssh "\$@"
EOF
    chmod +x "$DIR/ssh"
}

make_host() {  # make_host HOST RATE: create what is missing, repair what is half made
    local host=$1 rate=$2 i
    i=$(host_index "$host")
    ip netns list | grep -qw "^$host" || ip netns add "$host"
    if ! ip link show "$host-h" >/dev/null 2>&1; then
        ip -n "$host" link del eth0 2>/dev/null || true
        ip link add "$host-h" type veth peer name eth0 netns "$host"
    fi
    ip link set "$host-h" master "$BRIDGE" up
    ip -n "$host" addr replace "$SUBNET.$i/24" dev eth0
    ip -n "$host" link set eth0 up
    ip -n "$host" link set lo up
    ip -n "$host" route replace default via "$HEAD_IP"
    # Its own hostname: a UTS namespace kept alive by a bind mount on a file of $DIR.
    if ! nsenter --uts="$DIR/$host.uts" true 2>/dev/null; then
        touch "$DIR/$host.uts"
        unshare --uts="$DIR/$host.uts" true
    fi
    nsenter --uts="$DIR/$host.uts" hostname "$host"
    shape "$host" "$rate"
}

remove_host() {
    local host=$1 pids
    pids=$(ip netns pids "$host" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip link del "$host-h" 2>/dev/null || true
    ip netns del "$host" 2>/dev/null || true
    umount "$DIR/$host.uts" 2>/dev/null || true
    rm -rf "/etc/netns/$host" "$DIR/$host.uts" "$DIR/$host.rate"
}

up() {
    local n=${1:-} rate=${2:-1gbit} i host
    [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le 250 ] \
        || die "up needs the number of hosts (1-250), e.g. up 4 1gbit; got '${n}'"
    valid_rate "$rate" || die "'$rate' is not a rate tc knows (e.g. 1gbit, 100mbit, 500kbit)"
    need_root up
    mkdir -p "$DIR"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$HEAD_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for host in $(hosts); do  # hosts of an earlier, larger lab
        [ "$(host_index "$host")" -le "$n" ] || remove_host "$host"
    done
    : > "$DIR/hosts.new"
    for i in $(seq "$n"); do echo "$PREFIX$i" >> "$DIR/hosts.new"; done
    mv "$DIR/hosts.new" "$DIR/hosts"
    for host in $(hosts); do make_host "$host" "$rate"; done
    write_hosts_files
    write_entry
    say "$n host(s) up: ${PREFIX}1..$PREFIX$n on $SUBNET.0/24 (head $HEAD_IP), every link shaped to $rate"
    echo "launcher.hostfile=$DIR/hostfile launcher.remote_shell=$DIR/ssh"
}

down() {
    local host
    if [ "$(id -u)" -ne 0 ]; then
        [ -d "$DIR" ] || { say "no lab here"; return 0; }
        need_root down
    fi
    for host in $(hosts); do remove_host "$host"; done
    # Hosts left by a lab whose host list was lost (a crash between the two).
    for host in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX[0-9]+$" || true); do
        remove_host "$host"
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$DIR"
    rmdir /etc/netns 2>/dev/null || true  # when no other namespace keeps files there
    remove_stale_segments
    say "down: hosts, links, bridge and $DIR removed"
}

remove_stale_segments() {  # the shared memory that Open MPI's ranks killed on a host left
    local removed  # (the hosts share this machine's /dev/shm; named after the host)
    removed=$(remove_unmapped_segments -regextype posix-extended \
                  -regex "/dev/shm/sm_segment\.$PREFIX[0-9]+\..*")
    [ "$removed" -eq 0 ] || say "removed $removed shared-memory segment(s) that killed ranks left in /dev/shm"
}

link_state() {  # up, down or missing: the head's end of the host's link, as `link` sets it
    local host=$1 flags
    flags=$(ip -o link show "$host-h" 2>/dev/null) || { echo missing; return; }
    [[ "$flags" =~ [\<,]UP[,\>] ]] && echo up || echo down
}

status() {
    local host bad=0 state
    [ -s "$DIR/hosts" ] || { say "no lab is up (scripts/lab_cluster.sh up N)"; return 1; }
    for host in $(hosts); do
        state=$(link_state "$host")
        [ "$state" = up ] || bad=1
        printf '%-8s %-14s link %-7s rate %s\n' "$host" "$SUBNET.$(host_index "$host")" \
            "$state" "$(cat "$DIR/$host.rate" 2>/dev/null || echo '?')"
    done
    echo "launcher.hostfile=$DIR/hostfile launcher.remote_shell=$DIR/ssh"
    return $bad
}

known_host() {
    hosts | grep -qx "$1" || die "no lab host '$1' (hosts: $(hosts | tr '\n' ' '))"
}

rate() {
    local host=${1:-} new=${2:-}
    [ -n "$host" ] && [ -n "$new" ] || die "usage: rate HOST RATE, e.g. rate ${PREFIX}2 100mbit"
    valid_rate "$new" || die "'$new' is not a rate tc knows (e.g. 1gbit, 100mbit, 500kbit)"
    need_root rate
    known_host "$host"
    shape "$host" "$new"
    say "$host's link now shaped to $new"
}

link() {
    local host=${1:-} state=${2:-}
    [[ "$state" =~ ^(up|down)$ ]] || die "usage: link HOST down|up"
    need_root link
    known_host "$host"
    ip link set "$host-h" "$state"
    say "$host's link is $state"
}

enter() {  # ssh [OPTIONS] HOST COMMAND...: as ssh, one command line run by a shell on HOST
    while [[ "${1:-}" == -* ]]; do  # ssh's options (-x, -o BatchMode=yes...) mean nothing here
        case "$1" in -o|-p|-l|-i|-F|-E|-J) shift 2 ;; *) shift ;; esac
    done
    local host=${1:-}
    [ -n "$host" ] || { echo "usage: ssh HOST COMMAND" >&2; exit 255; }
    shift
    if ! hosts | grep -qx "$host"; then
        echo "ssh: Could not resolve hostname $host: Name or service not known" >&2
        exit 255
    fi
    if [ "$(link_state "$host")" != up ]; then
        echo "ssh: connect to host $host port 22: Network is unreachable" >&2
        exit 255
    fi
    export UCX_TLS=${LAB_UCX_TLS:-tcp,self} UCX_NET_DEVICES=eth0
    exec ip netns exec "$host" nsenter --uts="$DIR/$host.uts" -- /bin/sh -c "${*:-exec \$SHELL}"
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    status) status ;;
    rate) shift; rate "$@" ;;
    link) shift; link "$@" ;;
    ssh) shift; enter "$@" ;;
    *) echo "usage: $0 up N [RATE] | down | status | rate HOST RATE | link HOST down|up | ssh HOST COMMAND" >&2
       exit 2 ;;
esac
