# Lists this cluster's containers that an invocation inside a Slurm job
# started (labels io.cvs.managed=IDENTITY and io.cvs.slurm-job), on this
# host: one line each, "ID NAME STATE JOB LIFETIME". `cvs status` and
# `cvs down` run outside a job use it to find containers whose job is over
# (their names carry the job ID, so the file's own name does not find them).
# A container removed between the listing and the inspect is left out.
#
#   job_containers.sh IDENTITY -- RUNTIME...
ident=${1:-}
shift
[ "${1:-}" = -- ] && shift
if [ -z "$ident" ] || [ $# -eq 0 ]; then
  echo "cvs-job_containers: usage: IDENTITY -- RUNTIME..." >&2
  exit 2
fi
ids=$("$@" ps -aq --no-trunc --filter "label=io.cvs.managed=$ident" \
  --filter "label=io.cvs.slurm-job") || exit 1
[ -n "$ids" ] || exit 0
format='{{.Id}} {{.Name}} {{.State.Status}} {{index .Config.Labels "io.cvs.slurm-job"}}'
format="$format"' {{index .Config.Labels "io.cvs.lifetime"}}'
# shellcheck disable=SC2086  # IDs: hex words, one per line
"$@" inspect --format "$format" $ids 2>/dev/null
exit 0
