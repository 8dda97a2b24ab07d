# shellcheck shell=bash
# Two "hosts" on one machine, sourced by tests/multihost/run_two_hosts.sh
# and bench/network.sh (not run on its own):
#
#     source tests/multihost/netns_hosts.sh
#     netns_make_hosts || ...       # hA 10.213.0.1 and hB 10.213.0.2, one veth link
#     netns_on_host hA COMMAND...   # COMMAND "on" hA
#     netns_install_traps           # on exit: stop jobs, remove the hosts and $WORK (netns_exit)
#
# A host is a network namespace ${NS_PREFIX}hA / ${NS_PREFIX}hB joined to the
# other by one veth pair (eth0 in each). A command runs on a host in its
# namespace, with /etc/netns/NS/hosts as /etc/hosts (hA and hB resolve) and,
# in a UTS namespace of its own, the hostname hA or hB: OpenMPI's daemons and
# ranks then see the names mpirun knows the hosts by. The namespaces are
# private to the calling script (their names carry its pid), so runs in
# parallel do not collide even though they use the same addresses.
#
# The caller defines skip MESSAGE (prints SKIP and exits): netns_make_hosts
# calls it when this machine cannot make namespaces, UTS namespaces or veths.
# Needs root, ip (iproute2) and unshare.

NETNS_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NS_PREFIX=${NS_PREFIX:-dtrain-$$-}
SUBNET=10.213.0.0/24
declare -A ADDRESS=([hA]=10.213.0.1 [hB]=10.213.0.2)
NETNS_HOSTS=(hA hB)
netns_created_veth=

netns_on_host() {  # netns_on_host HOST COMMAND...: COMMAND in HOST's namespace, hostname HOST
  local host=$1
  shift
  ip netns exec "$NS_PREFIX$host" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

# Removes the hosts of runs that died without their trap (SIGKILL, a reboot
# of the shell): namespaces named dtrain-PID-hX whose PID is gone, and their
# /etc/netns entries. Those of live runs (another engineer's) are left alone.
netns_remove_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns =~ ^dtrain-([0-9]+)-h[AB]$ ]] || continue
    pid=${BASH_REMATCH[1]}
    kill -0 "$pid" 2>/dev/null && continue
    echo "removing namespace $ns, left by a run (pid $pid) that no longer runs"
    netns_remove "$ns"
  done
}

netns_remove() {  # netns_remove NS: kills what runs in NS, deletes it and its /etc/netns entry
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null)
  [[ -n $pids ]] && kill -KILL $pids 2>/dev/null
  ip netns del "$1" 2>/dev/null
  rm -rf "/etc/netns/$1"
}

netns_make_hosts() {
  local error host
  for host in "${NETNS_HOSTS[@]}"; do
    error=$(ip netns add "$NS_PREFIX$host" 2>&1) || skip "cannot create a network namespace (ip netns add: $error)"
  done
  error=$(netns_on_host hA true 2>&1) || skip "cannot enter a namespace with its own hostname (unshare --uts: $error)"
  netns_created_veth=va$$
  error=$(ip link add "va$$" type veth peer name "vb$$" 2>&1) || skip "cannot create a veth pair ($error)"
  ip link set "va$$" netns "${NS_PREFIX}hA" && ip link set "vb$$" netns "${NS_PREFIX}hB" || return 1
  netns_created_veth=
  local -A veth=([hA]=va$$ [hB]=vb$$)
  for host in "${NETNS_HOSTS[@]}"; do
    local ns=$NS_PREFIX$host
    ip -n "$ns" link set lo up &&
      ip -n "$ns" link set "${veth[$host]}" name eth0 &&
      ip -n "$ns" addr add "${ADDRESS[$host]}/24" dev eth0 &&
      ip -n "$ns" link set eth0 up || return 1
    mkdir -p "/etc/netns/$ns" &&
      printf '127.0.0.1 localhost\n%s hA\n%s hB\n' "${ADDRESS[hA]}" "${ADDRESS[hB]}" > "/etc/netns/$ns/hosts" || return 1
  done
  # The veth's carrier may take a moment.
  timeout 10 sh -c "until ip -n ${NS_PREFIX}hA link show eth0 | grep -q LOWER_UP &&
    ip -n ${NS_PREFIX}hB link show eth0 | grep -q LOWER_UP; do sleep 0.1; done"
}

# For the caller's EXIT trap: whatever still runs in the namespaces was
# started by the caller, so it is killed; then the namespaces, their
# /etc/netns entries (and /etc/netns itself when empty) and a veth that
# setup left in this namespace go.
netns_cleanup() {
  local host
  for host in "${NETNS_HOSTS[@]}"; do netns_remove "$NS_PREFIX$host"; done
  rmdir /etc/netns 2>/dev/null
  [[ -n $netns_created_veth ]] && ip link del "$netns_created_veth" 2>/dev/null
  return 0
}

# The callers' traps (netns_install_traps): on exit, stop this shell's jobs
# still running (timeout passes the TERM on to its command), remove the
# hosts, and remove the caller's $WORK folder unless the run failed (its
# exit status or $failures) or KEEP is set; Ctrl-C and TERM exit through it.
netns_exit() {
  local status=$?
  trap - EXIT INT TERM
  local pids
  pids=$(jobs -pr)
  [[ -n $pids ]] && kill -TERM $pids 2>/dev/null
  netns_cleanup
  if [[ -n ${WORK:-} ]]; then
    if [[ $status -eq 0 && ${failures:-0} -eq 0 && -z ${KEEP:-} ]]; then
      rm -rf "$WORK"
    else
      echo "logs kept in $WORK"
    fi
  fi
  exit "$status"
}
netns_install_traps() {
  trap netns_exit EXIT
  trap 'echo "interrupted"; exit 130' INT
  trap 'exit 143' TERM
}

# What mpirun on hA needs to reach hB without ssh (netns_agent.sh starts the
# remote daemon in hB's namespace) and to keep MPI's traffic on TCP over the
# veth link (btl tcp,self; pml ob1; its subnet); and, as ranks share the
# cores here, ranks that wait yield the core (spinning ones make a step 5x
# slower). NAME=VALUE words, for env.
netns_mpi_env() {
  echo OMPI_MCA_plm_rsh_agent="$NETNS_HERE/netns_agent.sh" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
    MULTIHOST_NS_PREFIX="$NS_PREFIX" OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self \
    OMPI_MCA_btl_tcp_if_include="$SUBNET" OMPI_MCA_oob_tcp_if_include="$SUBNET" OMPI_MCA_mpi_yield_when_idle=1
}
