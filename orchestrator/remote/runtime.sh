# The runtime on a host whose access the probe has not found (lib access.sh
# prepended): `cvs exec` and `cvs cp` without an `up`, reads by suites.
# A leading --podman / --podman-rootless names podman (access.sh).
#
#   runtime.sh read ARGS…              `RUNTIME ARGS`, a read: with each access
#                                      in turn until one succeeds
#   runtime.sh running NAME MESSAGE ARGS…  `RUNTIME ARGS` once container NAME is
#                                      found running (the same round trip);
#                                      else MESSAGE on stderr, exit 125
case $1 in --podman | --podman-rootless) cvs_runtime "$1"; shift ;; esac
what=$1
shift
cvs_docker_order
case $what in
  read)
    # shellcheck disable=SC2154  # cvs_order: set by cvs_docker_order
    for m in $cvs_order; do
      cvs_docker "$m" "$@" 2>/dev/null && exit 0
    done
    exit 1 ;;
  running)
    name=$1 message=$2
    shift 2
    # shellcheck disable=SC2154  # cvs_order: set by cvs_docker_order
    for m in $cvs_order; do
      if [ "$(cvs_docker "$m" inspect --type container -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ]; then
        if [ "$m" = direct ]; then exec "$cvs_rt" "$@"; else exec sudo -n "$cvs_rt" "$@"; fi
      fi
    done
    printf '%s\n' "$message" >&2
    exit 125 ;;
esac
echo "cvs: runtime.sh: unknown mode $what" >&2
exit 2
