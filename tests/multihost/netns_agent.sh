#!/bin/sh
# OpenMPI's launch agent for the hosts of tests/multihost/netns_hosts.sh, used instead of
# ssh (--mca plm_rsh_agent, or OMPI_MCA_plm_rsh_agent):
#     netns_agent.sh HOST COMMAND...
# Like `ssh HOST COMMAND...`, it joins the words of COMMAND into one shell
# command line and runs it "on HOST": in the network namespace
# ${MULTIHOST_NS_PREFIX}HOST (with that namespace's /etc/netns/.../hosts as
# /etc/hosts) and a UTS namespace of its own whose hostname is HOST, so
# OpenMPI's daemon and ranks there see the name mpirun knows the host by.
set -eu
host=$1
shift
exec ip netns exec "${MULTIHOST_NS_PREFIX:?set by netns_mpi_env in netns_hosts.sh}$host" \
  unshare --uts -- sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
