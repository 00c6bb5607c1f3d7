# Containers of Slurm jobs, on a host no probe has seen (lib access.sh
# prepended): `cvs status` and `cvs down` run outside a job use it to find
# this cluster's containers whose names carry a job ID (the file's own name
# does not find them), and to remove those whose job is over.
# A leading --podman / --podman-rootless names podman (access.sh).
#
#   job_containers.sh list IDENTITY   one line per container labelled
#       io.cvs.managed=IDENTITY and io.cvs.slurm-job:
#       "ID NAME STATE JOB LIFETIME" (one removed meanwhile is left out)
#   job_containers.sh remove ID...    `rm -f -v` each, by ID
case $1 in --podman | --podman-rootless) cvs_runtime "$1"; shift ;; esac
what=${1:-}
shift
cvs_docker_order
# shellcheck disable=SC2154  # cvs_order: set by cvs_docker_order
case $what in
  list)
    ident=${1:-}
    [ -n "$ident" ] || exit 2
    for m in $cvs_order; do
      ids=$(cvs_docker "$m" ps -aq --no-trunc --filter "label=io.cvs.managed=$ident" \
        --filter "label=io.cvs.slurm-job" 2>/dev/null) || continue
      [ -n "$ids" ] || exit 0
      format='{{.Id}} {{.Name}} {{.State.Status}} {{index .Config.Labels "io.cvs.slurm-job"}}'
      format="$format"' {{index .Config.Labels "io.cvs.lifetime"}}'
      # shellcheck disable=SC2086  # IDs: hex words
      cvs_docker "$m" inspect --format "$format" $ids 2>/dev/null
      exit 0
    done
    exit 1 ;;
  remove)
    for id in "$@"; do
      case $id in *[!0-9a-f]* | '') exit 2 ;; esac
    done
    for m in $cvs_order; do
      cvs_docker "$m" rm -f -v "$@" >/dev/null && exit 0
    done
    exit 1 ;;
esac
echo "cvs: job_containers.sh: unknown mode $what" >&2
exit 2
