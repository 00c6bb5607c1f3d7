#!/bin/sh
# Slurm epilog shipped by cvs (`cvs slurm epilog`): on every node of a job
# when Slurm releases it, remove the per_run and per_job containers cvs
# started for that job (labels io.cvs.slurm-job=$SLURM_JOB_ID and
# io.cvs.lifetime=per_run or per_job), by ID. Persistent containers are never touched. It never calls a Slurm
# command (an epilog must not) and always exits 0 (a non-zero exit drains
# the node), also when there is nothing to remove or no runtime answers.
job=${SLURM_JOB_ID:-}
case $job in '' | *[!0-9]*) exit 0 ;; esac
bound=
command -v timeout >/dev/null 2>&1 && bound="timeout 30"
for rt in docker podman; do
  command -v "$rt" >/dev/null 2>&1 || continue
  for lifetime in per_run per_job; do
    # shellcheck disable=SC2086  # $bound: empty, or two words
    ids=$($bound "$rt" ps -aq --filter "label=io.cvs.slurm-job=$job" \
      --filter "label=io.cvs.lifetime=$lifetime" 2>/dev/null) || continue
    for id in $ids; do
      case $id in *[!0-9a-f]*) continue ;; esac
      # shellcheck disable=SC2086
      $bound "$rt" rm -f -v "$id" >/dev/null 2>&1 || true
    done
  done
done
exit 0
