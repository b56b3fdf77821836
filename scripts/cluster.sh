#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# usage: cluster.sh run|up|exec|addr|down|check ...   (each below; -h, --help: this text)
#
# cluster.sh: emulate a small cluster on this host, for multi-node tests and benchmarks.
#
# Each node is a network namespace joined to a private bridge by a veth pair; tc tbf on both
# ends of the pair is the node's NIC (egress capped inside the namespace, ingress capped on the
# host side). Every process started in a node runs in its own UTS namespace with the node's
# hostname, so a program that groups ranks by hostname sees one host per node. Traffic only
# ever goes to addresses of namespaces this script made. Needs root.
#
#   cluster.sh run --nodes N --ranks-per-node M [--rate RATE] [--port P] [--grace S]
#                  [--timeout S] [--logs DIR] -- CMD ARGS...
#       Builds a private cluster (own name prefix and own free /24, so several runs can go on
#       at once), starts M copies of CMD in every node with the torchrun variables MASTER_ADDR
#       (node 0), MASTER_PORT, RANK (node*M + local), WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
#       and RESHARD_NODE (node index), waits for all, then tears everything down.
#       Output: each rank writes to its own log files; when all have ended, rank 0's stdout is
#       copied to stdout, and every other rank's stdout and every rank's stderr to stderr, each
#       line prefixed "[rank R] ". --logs DIR keeps the files (rankR.out, rankR.err) there.
#       RATE: a tc rate such as 1gbit or 100mbit (default 1gbit), or none (uncapped).
#       P: default 20000 + random (node 0's namespace is new, so any port is free there).
#       When a rank exits non-zero the others get --grace S seconds (default 10) to end, then
#       are killed. Exit status: that of the first rank to fail, 0 if all succeeded, 124 after
#       --timeout S seconds (default 600; everything is killed), 2 for bad usage.
#   cluster.sh up N [RATE]        build a cluster for manual use (RATE default 1gbit)
#   cluster.sh exec NODE CMD...   run CMD in node NODE (0-based) of that cluster
#   cluster.sh addr NODE          print node NODE's address
#   cluster.sh down [--all]       remove the manual cluster and any cluster whose run ended
#                                 without cleaning up; --all also removes running ones
#   cluster.sh check              exit 0 if this host can build a cluster, else print why, exit 1
#
# Environment: RS_CLUSTER_PREFIX names the manual cluster (default rsman); RS_CLUSTER_NET is
# the /16 the clusters' /24 subnets are taken from (default 10.201).
set -euo pipefail

STATE_DIR=/run/reshard-cluster  # one file per live cluster: its subnet, size and owner
NET16=${RS_CLUSTER_NET:-10.201}
MANUAL_PFX=${RS_CLUSTER_PREFIX:-rsman}
TBF_OPTS=(burst 256kb latency 100ms)  # as in shared/recipes/netns-cluster.sh
NODE_HOST_PREFIX=rsnode               # hostname of node i: rsnode<i>

say() { echo "cluster.sh: $*" >&2; }
usage_error() { say "$* (cluster.sh --help says more)"; exit 2; }

# ---------------------------------------------------------------------------------------------
# Names. A cluster is known by its prefix PFX (at most 6 characters), so the longest interface
# name, ${PFX}h<node>, stays within the kernel's 15 characters. run uses rs<4 hex digits>,
# check rsk<3 hex digits>, the manual cluster rsman: they cannot clash.

ns_name() { echo "${1}n$2"; }       # namespace of node $2
veth_host() { echo "${1}h$2"; }     # host end of node $2's veth pair, on the bridge
veth_node() { echo "${1}p$2"; }     # node end, inside the namespace
bridge_name() { echo "${1}br"; }
node_addr() { echo "$1.$(($2 + 10))"; }  # $1: the cluster's a.b.c

state_file() { echo "$STATE_DIR/$1.env"; }

# Start time of a process (field 22 of /proc/PID/stat), so a recycled pid is not taken for
# the owner of a cluster.
proc_start() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null || true; }

# Reads a cluster's state file into NET, NODES, RATE, OWNER, OWNER_START.
load_state() {
    local f
    f=$(state_file "$1")
    [ -r "$f" ] || return 1
    # shellcheck disable=SC1090  # written by save_state below
    . "$f"
}

# The namespaces that exist for prefix $1 (also the ones a killed run left behind).
cluster_namespaces() {
    ip netns list | awk '{print $1}' | grep -E "^${1}n[0-9]+\$" || true
}

# ---------------------------------------------------------------------------------------------
# Building and removing a cluster.

# An ip dump read whole, its text on stdout. While other jobs change their links and
# namespaces, ip complains on stderr of what it met half-made or half-gone ("Peer netns
# reference is invalid") and the kernel cuts a dump short ("Dump was interrupted and may be
# inconsistent"): the complaints are not this run's business and stay off its output; a cut
# dump is read again. Fails, saying why, when ip fails or no read came out whole in 20 tries.
ip_dump() {
    local out err rc tries f
    f=$(mktemp "${TMPDIR:-/tmp}/reshard-ip.XXXXXX") || return 1
    for ((tries = 0; tries < 20; tries++)); do
        rc=0
        out=$(ip "$@" 2>"$f") || rc=$?
        err=$(cat "$f")
        if [ "$rc" = 0 ] && [[ $err != *"Dump was interrupted"* ]]; then
            rm -f "$f"
            printf '%s\n' "$out"
            return 0
        fi
        sleep 0.05
    done
    rm -f "$f"
    say "ip $* did not give a whole answer in 20 tries (status $rc): ${err:-cut short}"
    return 1
}

# Picks a /24 of $NET16 that no interface, route or other cluster of ours uses. Runs under the
# lock, and the caller writes the cluster's state file (which names its subnet) before
# releasing the lock, so two concurrent runs never pick the same one.
pick_subnet() {
    local dump used x
    dump=$(ip_dump -4 -o addr show) && dump+=$'\n'$(ip_dump -4 route show table all) || return 1
    used=$( { printf '%s\n' "$dump"; sed -n 's/^NET=\(.*\)/\1./p' "$STATE_DIR"/*.env 2>/dev/null; } |
            grep -oE "${NET16//./\\.}\.[0-9]+\." || true)
    for x in $(shuf -i 0-255); do
        if ! grep -qx "${NET16//./\\.}\.$x\." <<<"$used"; then
            echo "$NET16.$x"
            return 0
        fi
    done
    say "no free /24 left in $NET16.0.0/16"
    return 1
}

save_state() {
    local pfx=$1
    cat >"$(state_file "$pfx")" <<EOF
NET=$NET
NODES=$NODES
RATE=$RATE
OWNER=$OWNER
OWNER_START=$OWNER_START
TMP=$RUN_TMP
EOF
}

# Reserves a subnet and creates the bridge: the only step that must not race with another run.
# Sets NET. $1 prefix, $2 nodes, $3 rate, $4 owner pid (0: manual cluster, never collected).
reserve_cluster() {
    local pfx=$1 br
    br=$(bridge_name "$pfx")
    NODES=$2 RATE=$3 OWNER=$4
    OWNER_START=0
    [ "$OWNER" = 0 ] || OWNER_START=$(proc_start "$OWNER")
    mkdir -p "$STATE_DIR"
    exec {lock_fd}>"$STATE_DIR/lock"
    flock "$lock_fd"
    if [ -e "$(state_file "$pfx")" ] || ip link show "$br" >/dev/null 2>&1; then
        flock -u "$lock_fd"
        say "a cluster named $pfx exists already"
        return 1
    fi
    NET=$(pick_subnet)
    save_state "$pfx"  # from here on, teardown knows what to remove
    ip link add "$br" type bridge
    # Bridged frames must not go through the host's iptables (br_netfilter may be loaded).
    ip link set "$br" type bridge nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0 \
        2>/dev/null || true
    # No address on the bridge: the nodes talk through it at layer 2, and a host address would
    # be advertised by programs on the host (UCX lists every interface) and vanish under them
    # when this cluster goes down.
    ip link set "$br" up
    flock -u "$lock_fd"
    exec {lock_fd}>&-
}

# One node: namespace, veth pair to the bridge, address, and the NIC caps.
add_node() {
    local pfx=$1 i=$2 rate=$3 ns h p
    ns=$(ns_name "$pfx" "$i") h=$(veth_host "$pfx" "$i") p=$(veth_node "$pfx" "$i")
    ip netns add "$ns"
    ip link add "$h" type veth peer name "$p"
    ip link set "$p" netns "$ns"
    ip link set "$h" master "$(bridge_name "$pfx")"
    ip link set "$h" up
    ip -n "$ns" addr add "$(node_addr "$NET" "$i")/24" dev "$p"
    ip -n "$ns" link set "$p" up
    ip -n "$ns" link set lo up
    if [ "$rate" != none ]; then
        # Both directions: the node's egress inside the namespace, its ingress on the host end.
        ip netns exec "$ns" tc qdisc add dev "$p" root tbf rate "$rate" "${TBF_OPTS[@]}"
        tc qdisc add dev "$h" root tbf rate "$rate" "${TBF_OPTS[@]}"
    fi
}

# The kernel reports a veth's carrier (IFF_RUNNING) a moment after both ends are up, later
# still on a loaded machine; ranks that start before it see no usable interface. Waits for
# every node's link to be up, 20 s at most.
wait_links() {
    local pfx=$1 nodes=$2 i state tries
    for ((i = 0; i < nodes; i++)); do
        for ((tries = 0; tries < 200; tries++)); do
            state=$(ip -n "$(ns_name "$pfx" "$i")" -o link show "$(veth_node "$pfx" "$i")" 2>/dev/null)
            case $state in *"state UP"*) break ;; esac
            sleep 0.1
        done
        case $state in
        *"state UP"*) ;;
        *) echo "cluster.sh: node $i's link did not come up in 20 s: $state" >&2; return 1 ;;
        esac
    done
}

cluster_up() {
    local pfx=$1 nodes=$2 rate=$3 owner=$4 i
    reserve_cluster "$pfx" "$nodes" "$rate" "$owner"
    for ((i = 0; i < nodes; i++)); do
        add_node "$pfx" "$i" "$rate"
    done
    wait_links "$pfx" "$nodes"
}

# Kills whatever still runs in the cluster's namespaces (only our namespaces, so only processes
# we started there), then removes namespaces, veths, bridge and state file. Safe to call on a
# half-built cluster and more than once.
cluster_down() {
    local pfx=$1 nss ns pids i
    nss=$(cluster_namespaces "$pfx")
    for sig in TERM KILL; do
        pids=$(for ns in $nss; do ip netns pids "$ns" 2>/dev/null || true; done)
        [ -n "$pids" ] || break
        # shellcheck disable=SC2086  # a list of pids
        kill -s "$sig" $pids 2>/dev/null || true
        [ "$sig" = KILL ] || sleep 0.5
    done
    for ns in $nss; do
        i=${ns#"${pfx}n"}
        ip link del "$(veth_host "$pfx" "$i")" 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$(bridge_name "$pfx")" 2>/dev/null || true
    rm -f "$(state_file "$pfx")"
}

# Removes clusters whose owning run died without cleaning up (killed with SIGKILL, say).
collect_stale() {
    local f pfx
    for f in "$STATE_DIR"/*.env; do
        [ -e "$f" ] || continue
        pfx=$(basename "$f" .env)
        (
            load_state "$pfx" || exit 0
            if [ "$OWNER" != 0 ] && [ "$(proc_start "$OWNER")" != "$OWNER_START" ]; then
                cluster_down "$pfx"
                [ -z "${TMP:-}" ] || rm -rf "$TMP"
            fi
        )
    done
}

# Sets NODE_CMD to the words that run a command inside node $2 of cluster $1, with the node's
# hostname in a UTS namespace of its own. Every step execs, so the pid stays the command's.
node_cmd() {
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
    NODE_CMD=(ip netns exec "$(ns_name "$1" "$2")" unshare --uts --
              sh -c 'hostname "$0" && exec "$@"' "$NODE_HOST_PREFIX$2")
}

valid_rate() { [ "$1" = none ] || [[ $1 =~ ^[0-9]+(\.[0-9]+)?[kKmMgGtT]?(bit|bps)$ ]]; }
# need_int VALUE MIN MAX MESSAGE: a usage error unless VALUE is an integer in [MIN, MAX].
need_int() {
    if ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt "$2" ] || [ "$1" -gt "$3" ]; then
        usage_error "$4"
    fi
}

# ---------------------------------------------------------------------------------------------
# run

# RUN_TMP holds, per rank R, rankR.pid (the rank's pid, also its process group) and rankR.rc
# (its exit status, written when it has ended); logs go to LOG_DIR (RUN_TMP unless --logs).
RUN_PFX='' RUN_TMP='' LOG_DIR='' WORLD=0 RUN_BUILDING=0

# Signals the process group of every rank that has not ended (each rank leads its own
# session, see launch).
signal_ranks() {
    local r pid
    for ((r = 0; r < WORLD; r++)); do
        [ ! -e "$RUN_TMP/rank$r.rc" ] || continue
        read -r pid 2>/dev/null <"$RUN_TMP/rank$r.pid" || continue
        kill -s "$1" -- "-$pid" 2>/dev/null || true
    done
}

# Rank 0's stdout to stdout; the other ranks' stdout and all stderr to stderr, prefixed.
print_logs() {
    local dir=$1 world=$2 r
    [ -n "$dir" ] && [ -d "$dir" ] || return 0
    cat "$dir/rank0.out" 2>/dev/null || true
    for ((r = 0; r < world; r++)); do
        if [ "$r" != 0 ] && [ -s "$dir/rank$r.out" ]; then
            sed "s/^/[rank $r] /" "$dir/rank$r.out" >&2
        fi
        if [ -s "$dir/rank$r.err" ]; then
            sed "s/^/[rank $r] /" "$dir/rank$r.err" >&2
        fi
    done
}

run_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ "$RUN_BUILDING" = 0 ] || say "run: could not build the cluster (cluster.sh check says why)"
    [ -z "$RUN_TMP" ] || signal_ranks KILL
    [ -z "$RUN_PFX" ] || cluster_down "$RUN_PFX"
    [ -z "$RUN_TMP" ] || rm -rf "$RUN_TMP"
    exit "$rc"
}

run_interrupted() {
    say "interrupted: stopping every rank and removing the cluster"
    signal_ranks TERM
    print_logs "$LOG_DIR" "$WORLD"
    exit "$1"
}

# Starts rank $3 = node $1 * M + local $2 in its node. A watcher subshell records the rank's
# pid and, once it ends, its exit status, in files the wait loop polls: simpler and sturdier
# than bash's job table (wait -n on a list of pids can lose a status that was reaped early).
# setsid makes the rank lead a session of its own, so Ctrl-C at the terminal reaches only this
# script, which then stops the ranks itself, and killing the group kills the rank's children.
launch() {
    local node=$1 local_rank=$2 rank=$3
    shift 3
    node_cmd "$RUN_PFX" "$node"
    (
        setsid "${NODE_CMD[@]}" env \
            MASTER_ADDR="$MASTER_ADDR" MASTER_PORT="$MASTER_PORT" RANK="$rank" \
            WORLD_SIZE="$WORLD" LOCAL_RANK="$local_rank" LOCAL_WORLD_SIZE="$PER_NODE" \
            RESHARD_NODE="$node" "$@" \
            </dev/null >"$LOG_DIR/rank$rank.out" 2>"$LOG_DIR/rank$rank.err" &
        echo $! >"$RUN_TMP/rank$rank.pid"
        rc=0
        wait $! || rc=$?
        echo "$rc" >"$RUN_TMP/rank$rank.rc.new"
        mv "$RUN_TMP/rank$rank.rc.new" "$RUN_TMP/rank$rank.rc"  # appears whole or not at all
    ) 2>/dev/null &  # (no "Killed" job notices: the status says it)
}

cmd_run() {
    local nodes='' rate=1gbit port='' grace=10 timeout=600 logs=''
    PER_NODE=
    while [ $# -gt 0 ]; do
        case $1 in
            --nodes) nodes=${2:-}; shift 2 ;;
            --ranks-per-node) PER_NODE=${2:-}; shift 2 ;;
            --rate) rate=${2:-}; shift 2 ;;
            --port) port=${2:-}; shift 2 ;;
            --grace) grace=${2:-}; shift 2 ;;
            --timeout) timeout=${2:-}; shift 2 ;;
            --logs) logs=${2:-}; shift 2 ;;
            --) shift; break ;;
            *) usage_error "run: unknown option '$1'" ;;
        esac
    done
    need_int "$nodes" 1 200 "run: --nodes needs a number from 1 to 200"
    need_int "$PER_NODE" 1 1000 "run: --ranks-per-node needs a number from 1 to 1000"
    valid_rate "$rate" || usage_error "run: --rate '$rate' is neither a tc rate (1gbit) nor none"
    [ -z "$port" ] || need_int "$port" 1 65535 "run: --port needs a port number"
    need_int "$grace" 0 86400 "run: --grace needs seconds"
    need_int "$timeout" 1 604800 "run: --timeout needs seconds"
    [ $# -gt 0 ] || usage_error "run: no command after --"
    [ "$(id -u)" = 0 ] || { say "run: needs root (network namespaces)"; exit 1; }

    WORLD=$((nodes * PER_NODE))
    MASTER_PORT=${port:-$((20000 + RANDOM % 10000))}
    RUN_TMP=$(mktemp -d "${TMPDIR:-/tmp}/reshard-cluster.XXXXXX")
    LOG_DIR=$RUN_TMP
    if [ -n "$logs" ]; then
        mkdir -p "$logs"
        LOG_DIR=$logs
    fi
    trap run_cleanup EXIT
    trap 'run_interrupted 130' INT
    trap 'run_interrupted 143' TERM

    collect_stale
    local try
    for try in 1 2 3 4 5; do  # a random prefix; retry on the rare clash with a live cluster
        RUN_PFX=rs$(printf '%04x' $((RANDOM % 65536)))
        if ! [ -e "$(state_file "$RUN_PFX")" ] && [ -z "$(cluster_namespaces "$RUN_PFX")" ]; then
            break
        fi
        [ "$try" != 5 ] || { RUN_PFX=; say "run: no free cluster name"; exit 1; }
    done
    # Not "if ! cluster_up": that would switch off set -e inside it. A failed step ends the
    # script through set -e, and run_cleanup removes what was built.
    RUN_BUILDING=1
    cluster_up "$RUN_PFX" "$nodes" "$rate" "$$"
    RUN_BUILDING=0
    MASTER_ADDR=$(node_addr "$NET" 0)

    local node lr
    for ((node = 0; node < nodes; node++)); do
        for ((lr = 0; lr < PER_NODE; lr++)); do
            launch "$node" "$lr" $((node * PER_NODE + lr)) "$@"
        done
    done
    wait_ranks "$grace" "$timeout"
    wait  # the watcher subshells, all about to end

    print_logs "$LOG_DIR" "$WORLD"
    [ -z "$logs" ] || say "per-rank logs kept in $logs"
    exit "$RUN_STATUS"
}

# Polls until every rank has ended. Sets RUN_STATUS: the first non-zero exit status, 0 when
# all succeeded, 124 on timeout. After a failure the others get $1 seconds, then TERM, then
# KILL 3 s later; on timeout ($2 seconds) TERM at once.
wait_ranks() {
    local grace=$1 timeout=$2 r rc left
    local grace_end='' kill_end='' timed_out=0 deadline=$((SECONDS + timeout))
    local -a ended=()
    RUN_STATUS=0
    while :; do
        left=0
        for ((r = 0; r < WORLD; r++)); do
            [ -z "${ended[r]:-}" ] || continue
            if ! read -r rc 2>/dev/null <"$RUN_TMP/rank$r.rc"; then
                left=$((left + 1))
                continue
            fi
            ended[r]=1
            if [ "$rc" != 0 ] && [ "$RUN_STATUS" = 0 ] && [ "$timed_out" = 0 ]; then
                RUN_STATUS=$rc
                say "rank $r exited with status $rc; the others have ${grace}s to end"
                grace_end=$((SECONDS + grace))
            fi
        done
        [ "$left" != 0 ] || break
        if [ "$timed_out" = 0 ] && [ "$SECONDS" -ge "$deadline" ]; then
            say "timeout after ${timeout}s: killing the $left ranks still running"
            timed_out=1 RUN_STATUS=124 grace_end=$SECONDS
        fi
        if [ -n "$grace_end" ] && [ -z "$kill_end" ] && [ "$SECONDS" -ge "$grace_end" ]; then
            [ "$timed_out" = 1 ] || say "killing the $left ranks still running"
            signal_ranks TERM
            kill_end=$((SECONDS + 3))
        fi
        if [ -n "$kill_end" ] && [ "$SECONDS" -ge "$kill_end" ]; then
            signal_ranks KILL
        fi
        sleep 0.1
    done
}

# ---------------------------------------------------------------------------------------------
# up / exec / addr / down: one long-lived cluster for manual use, named $MANUAL_PFX.

cmd_up() {
    local nodes=${1:-} rate=${2:-1gbit} i
    need_int "$nodes" 1 200 "up: N must be a number from 1 to 200"
    valid_rate "$rate" || usage_error "up: '$rate' is neither a tc rate (1gbit) nor none"
    [ "$(id -u)" = 0 ] || { say "up: needs root (network namespaces)"; exit 1; }
    [ ${#MANUAL_PFX} -le 6 ] || usage_error "RS_CLUSTER_PREFIX: at most 6 characters"
    collect_stale
    if load_state "$MANUAL_PFX"; then
        say "up: cluster $MANUAL_PFX is up already ($NODES nodes); 'cluster.sh down' first"
        exit 1
    fi
    trap 'say "up failed: removing what was built"; cluster_down "$MANUAL_PFX"' EXIT
    cluster_up "$MANUAL_PFX" "$nodes" "$rate" 0
    trap - EXIT
    for ((i = 0; i < nodes; i++)); do
        echo "node $i  $(ns_name "$MANUAL_PFX" "$i")  $(node_addr "$NET" "$i")  $NODE_HOST_PREFIX$i"
    done
}

need_manual() {
    load_state "$MANUAL_PFX" || { say "no cluster $MANUAL_PFX: run 'cluster.sh up N' first"; exit 1; }
    need_int "${1:-}" 0 $((NODES - 1)) "NODE must be 0 to $((NODES - 1))"
}

cmd_exec() {
    need_manual "${1:-}"
    local node=$1
    shift
    [ $# -gt 0 ] || usage_error "exec: no command"
    node_cmd "$MANUAL_PFX" "$node"
    exec "${NODE_CMD[@]}" "$@"
}

cmd_addr() {
    need_manual "${1:-}"
    node_addr "$NET" "$1"
}

cmd_down() {
    local f
    if [ "${1:-}" = --all ]; then
        for f in "$STATE_DIR"/*.env; do
            [ -e "$f" ] && cluster_down "$(basename "$f" .env)"
        done
    fi
    cluster_down "$MANUAL_PFX"
    collect_stale
}

# ---------------------------------------------------------------------------------------------
# check: builds a one-node cluster with every feature run uses, and says which step failed.

# Not local: the EXIT trap that removes them runs after cmd_check has returned.
CHECK_NS='' CHECK_H='' CHECK_BR=''
cmd_check() {
    local pfx p step
    fail() { echo "cluster.sh check: $*"; exit 1; }
    [ "$(id -u)" = 0 ] || fail "not root: network namespaces need root"
    for step in ip tc unshare setsid flock shuf; do
        command -v "$step" >/dev/null || fail "'$step' not found (packages iproute2, util-linux, coreutils)"
    done
    pfx=rsk$(printf '%03x' $((RANDOM % 4096)))
    CHECK_NS=$(ns_name "$pfx" 0) CHECK_H=$(veth_host "$pfx" 0) CHECK_BR=$(bridge_name "$pfx")
    p=$(veth_node "$pfx" 0)
    trap 'ip link del "$CHECK_H" 2>/dev/null; ip link del "$CHECK_BR" 2>/dev/null
          ip netns del "$CHECK_NS" 2>/dev/null; true' EXIT
    local ns=$CHECK_NS h=$CHECK_H br=$CHECK_BR
    try() {
        local what=$1 out
        shift
        out=$("$@" 2>&1) || fail "cannot $what: ${out:-exit status $?} ($*)"
    }
    try "create a network namespace" ip netns add "$ns"
    try "create a veth pair" ip link add "$h" type veth peer name "$p"
    try "move a veth into a namespace" ip link set "$p" netns "$ns"
    try "create a bridge" ip link add "$br" type bridge
    try "attach a veth to a bridge" ip link set "$h" master "$br"
    try "add a tc tbf qdisc" tc qdisc add dev "$h" root tbf rate 1gbit "${TBF_OPTS[@]}"
    try "add a tc tbf qdisc in a namespace" \
        ip netns exec "$ns" tc qdisc add dev "$p" root tbf rate 1gbit "${TBF_OPTS[@]}"
    # shellcheck disable=SC2016  # $(hostname) is the inner shell's
    try "set a hostname in a UTS namespace (unshare --uts)" \
        ip netns exec "$ns" unshare --uts -- sh -c 'hostname rscheck && [ "$(hostname)" = rscheck ]'
    echo "cluster.sh check: ok"
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
        run) cmd_run "$@" ;;
        up) cmd_up "$@" ;;
        exec) cmd_exec "$@" ;;
        addr) cmd_addr "$@" ;;
        down) cmd_down "$@" ;;
        check) cmd_check ;;
        -h | --help | help) awk 'NR > 3 && !/^#/ { exit } NR > 3 { sub(/^# ?/, ""); print }' "$0" ;;
        *) usage_error "unknown command '$cmd' (run, up, exec, addr, down, check)" ;;
    esac
}

main "$@"
