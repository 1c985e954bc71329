#!/usr/bin/env bash
# The nodes of the local Slurm cluster beyond the machine itself: each one a
# set of Linux namespaces of its own (UTS: its hostname; mount: its own mounts,
# e.g. its own mount of a bucket with its own caches; PID: its own processes,
# all gone when the node is), with a slurmd of its own (its own port, address
# and spool) or, for the login node, nothing but what is run on it.
#
#   scripts/slurm-dev-node.sh start NAME [slurmd|login]  boot a node; idempotent
#   scripts/slurm-dev-node.sh kill NAME                  take it away at once, with all it runs
#   scripts/slurm-dev-node.sh on NAME CMD [ARG...]       run CMD on the node (its hostname, mounts, processes)
#   scripts/slurm-dev-node.sh up NAME                    exit 0 if the node is booted
#   scripts/slurm-dev-node.sh resume HOSTLIST            Slurm's ResumeProgram: "provision" cloud nodes
#   scripts/slurm-dev-node.sh suspend HOSTLIST           Slurm's SuspendProgram: remove them
#   scripts/slurm-dev-node.sh list                       the booted nodes
#
# The nodes share the machine's network (each slurmd listens on a port of its
# own at an address of 127.0.1.0/24): jobs on them reach services on this
# machine's loopback, as a real cluster's nodes reach theirs over the network.
# Started by scripts/slurm-dev-cluster.sh, which writes the node table
# ($WAYPOST_SLURM_DIR/nodes/table: name, kind, address, port per line; kind
# compute, cloud-cpu, cloud-gpu or login).
# A node runs the executables in $WAYPOST_SLURM_DIR/nodes/boot.d/ (its name
# as their argument) as it boots, before its slurmd: its startup scripts,
# as a cloud image's mount the bucket with gcsfuse.
set -euo pipefail

STATE=${WAYPOST_SLURM_DIR:-/var/lib/waypost-slurm}
NODES=$STATE/nodes
RUN=$STATE/run
LOG=$STATE/log
SELF=$(readlink -f "${BASH_SOURCE[0]}")

say() { printf '[slurm-node] %s\n' "$*"; }
die() { say "ERROR: $*" >&2; exit 1; }

# The outer pid of a booted node (the `unshare` that holds its namespaces).
node_pid() {
    local f=$RUN/node-$1.pid pid
    [[ -s $f ]] || return 1
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == unshare ]] || return 1
    echo "$pid"
}

# The pid (in this machine's view) of the node's init: its PID namespace's 1.
node_init() {
    local pid child
    pid=$(node_pid "$1") || return 1
    child=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null | awk '{ print $1 }')
    [[ -n $child ]] || return 1
    echo "$child"
}

known() { awk -v n="$1" '$1 == n { found = 1 } END { exit !found }' "$NODES/table" 2>/dev/null; }

cmd_start() {
    local name=$1 kind=${2:-slurmd} i
    known "$name" || die "no node $name in $NODES/table (start the cluster: scripts/slurm-dev-cluster.sh start)"
    if node_init "$name" >/dev/null; then
        return 0
    fi
    rm -f "$RUN/node-$name.pid"
    mkdir -p "$NODES/$name" "$LOG" "$RUN"
    : >"$LOG/node-$name.stderr"
    # --kill-child: the namespaces' init (and so every process of the node)
    # dies with this unshare. 9>&-: not the cluster script's lock.
    # A time namespace too, where there is one: the node's uptime counts from
    # its boot, as Slurm checks that a resumed cloud node did boot.
    local up clock=()
    up=$(awk '{ printf "%d", $1 }' /proc/uptime)
    if unshare --time --boottime "-$up" true 2>/dev/null; then clock=(--time --boottime "-$up"); fi
    setsid unshare --uts --mount --pid "${clock[@]}" --fork --kill-child --mount-proc --propagation private \
        bash "$SELF" init "$name" "$kind" </dev/null >>"$LOG/node-$name.stderr" 2>&1 9>&- &
    echo $! >"$RUN/node-$name.pid"
    for ((i = 0; i < 50; i++)); do
        if [[ -e $NODES/$name/booted ]] && node_init "$name" >/dev/null; then
            say "$name: booted ($kind)"
            return 0
        fi
        sleep 0.1
    done
    tail -n 20 "$LOG/node-$name.stderr" >&2 || true
    die "$name did not boot in 5 s (log: $LOG/node-$name.stderr)"
}

# PID 1 of a node: its hostname and /etc/hosts, then slurmd (or nothing, for
# a login node); it reaps what is orphaned inside and lives until killed.
cmd_init() {
    local name=$1 kind=$2
    rm -f "$NODES/$name/booted"
    hostname "$name"
    mount --bind "$NODES/hosts" /etc/hosts
    # Its startup scripts (a cloud image's, e.g. mounting the bucket), in order.
    local script
    for script in "$NODES"/boot.d/*; do
        [[ -x $script ]] || continue
        "$script" "$name" || echo "node $name: startup script $script failed ($?)"
    done
    if [[ $kind != login ]]; then
        /usr/sbin/slurmd -D -N "$name" >>"$LOG/node-$name.stderr" 2>&1 &
    fi
    : >"$NODES/$name/booted"
    trap '' TERM INT HUP
    while :; do
        wait || true
        sleep 1
    done
}

cmd_kill() {
    local name=$1 pid i
    if ! pid=$(node_pid "$name"); then
        rm -f "$RUN/node-$name.pid" "$NODES/$name/booted"
        return 0
    fi
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        [[ -e /proc/$pid ]] || break
        sleep 0.1
    done
    rm -f "$RUN/node-$name.pid" "$NODES/$name/booted"
    say "$name: gone"
}

cmd_on() {
    local name=$1 init
    shift
    init=$(node_init "$name") || die "node $name is not booted (scripts/slurm-dev-node.sh start $name)"
    local clock=()
    [[ $(readlink "/proc/$init/ns/time") == "$(readlink /proc/self/ns/time)" ]] || clock=(--time)
    exec nsenter --target "$init" --uts --mount --pid "${clock[@]}" --wd="$PWD" -- "$@"
}

# Slurm hands ResumeProgram/SuspendProgram a hostlist ("wp-c[1-2]").
cmd_resume() {
    local n
    # Slurm counts a resume done only for a node that booted after it was asked,
    # by the node's uptime, to the second; so does a cloud VM, which takes a while.
    # The node's time namespace takes whole seconds off the machine's uptime,
    # so its own starts at the fraction left (up to 1 s): 2 s, not 1, always
    # puts its boot in a later second than the request.
    sleep 2
    for n in $(scontrol show hostnames "$1"); do
        cmd_start "$n" slurmd
    done
}

cmd_suspend() {
    local n
    for n in $(scontrol show hostnames "$1"); do
        cmd_kill "$n"
    done
}

cmd_list() {
    local name
    for f in "$RUN"/node-*.pid; do
        [[ -e $f ]] || continue
        name=${f##*/node-}
        name=${name%.pid}
        node_init "$name" >/dev/null && echo "$name"
    done
    return 0
}

case ${1:-} in
    start) cmd_start "${2:?node name}" "${3:-slurmd}" ;;
    init) cmd_init "$2" "$3" ;;
    kill) cmd_kill "${2:?node name}" ;;
    on) shift; cmd_on "${1:?node name}" "${@:2}" ;;
    up) node_init "${2:?node name}" >/dev/null ;;
    resume) cmd_resume "${2:?hostlist}" >>"$LOG/power.log" 2>&1 ;;
    suspend) cmd_suspend "${2:?hostlist}" >>"$LOG/power.log" 2>&1 ;;
    list) cmd_list ;;
    *)
        echo "usage: $0 start NAME [slurmd|login] | kill NAME | on NAME CMD... | up NAME | resume|suspend HOSTLIST | list" >&2
        exit 2 ;;
esac
