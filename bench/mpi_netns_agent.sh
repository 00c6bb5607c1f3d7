#!/bin/sh
# Open MPI's launcher agent for bench/mpi_ring.py (`--mca plm_rsh_agent`):
# where mpirun would run `ssh HOST COMMAND…`, run COMMAND in HOST's network
# namespace on this machine instead (no ssh, no container: the baseline).
# CVS_BENCH_NETNS: space-separated ADDRESS=NETNS pairs.
host=$1
shift
for pair in $CVS_BENCH_NETNS; do
  if [ "${pair%%=*}" = "$host" ]; then
    exec nsenter --net="/var/run/netns/${pair#*=}" sh -c "$*"
  fi
done
echo "mpi_netns_agent: no namespace for $host" >&2
exit 1
