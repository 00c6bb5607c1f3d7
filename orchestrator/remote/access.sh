# Library (prepended to a program, never run alone): how this host reaches
# the container runtime, the one rule cvs follows wherever the probe has not
# already said (remote/runtime.py says why podman's rule differs).
#
# cvs_runtime FLAG: "" (docker), --podman (rootful) or --podman-rootless;
# sets cvs_rt (the CLI) and cvs_rootless.
# cvs_docker_order: sets cvs_order. docker: "direct sudo" or "sudo direct":
# plain `docker` first, unless the socket's permissions say it cannot work
# (then `sudo -n docker` first). Rootful podman: plain `podman` only as root,
# else `sudo -n podman` (anyone else would reach their own rootless store).
# Rootless podman: plain only. Costs no process but `id` for rootful podman.
#
# One Go thread per docker client: its start-up costs less CPU.
GOMAXPROCS=1
export GOMAXPROCS
cvs_rt=docker
cvs_rootless=
cvs_runtime() {
  case $1 in
    --podman) cvs_rt=podman ;;
    --podman-rootless) cvs_rt=podman cvs_rootless=1 ;;
  esac
}
# shellcheck disable=SC2034  # cvs_order: read by the program this is prepended to
cvs_docker_order() {
  if [ "$cvs_rt" = podman ]; then
    if [ -n "$cvs_rootless" ] || [ "$(id -u)" = 0 ]; then cvs_order=direct; else cvs_order=sudo; fi
    return 0
  fi
  cvs_order="direct sudo"
  case ${DOCKER_HOST:-unix:///var/run/docker.sock} in
    unix://*)
      _cvs_sock=${DOCKER_HOST:-unix:///var/run/docker.sock}
      _cvs_sock=${_cvs_sock#unix://}
      if [ -S "$_cvs_sock" ] && [ ! -w "$_cvs_sock" ]; then cvs_order="sudo direct"; fi ;;
  esac
}
# What differs between the runtimes on the host side is said here, once; the
# programs call these and never test $cvs_rt themselves (tests/test_runtime_seam.py).
#
# cvs_other_runtime: sets cvs_other, the runtime this one is not (a host that
# lacks the cluster's runtime may have the other).
# shellcheck disable=SC2034  # cvs_other: read by the program
cvs_other_runtime() {
  if [ "$cvs_rt" = docker ]; then cvs_other=podman; else cvs_other=docker; fi
}
# cvs_time_format: sets cvs_tf, what a Go template adds to a time field so it
# prints as docker prints it (RFC 3339, one word): podman's default text has
# spaces in it.
# shellcheck disable=SC2034  # cvs_tf: read by the program
cvs_time_format() {
  if [ "$cvs_rt" = podman ]; then
    cvs_tf='.Format "2006-01-02T15:04:05.000000000Z07:00"'
  else
    cvs_tf=
  fi
}
# cvs_runtime_frame: the probe's runtime frame (none for docker); a rootless
# one adds the login user's cgroup facts (lib cgroup.sh).
cvs_runtime_frame() {
  [ "$cvs_rt" = podman ] || return 0
  if [ -n "$cvs_rootless" ]; then
    printf '@@cvs:runtime podman rootless\n'
    cvs_cgroup_facts
  else
    printf '@@cvs:runtime podman rootful\n'
  fi
}
# cvs_inspect NAME IMAGE FORMAT -- RUNTIME…: one inspect of the container and
# (IMAGE not empty) the image, in docker's shape (podman: lib podman.sh).
cvs_inspect() {
  _cin=$1 _cii=$2 _cif=$3
  shift 4
  if [ "$cvs_rt" = podman ]; then
    podman_inspect "$_cin" "$_cii" -- "$@"
  elif [ -n "$_cii" ]; then
    "$@" inspect --format "$_cif" "$_cin" "$_cii"
  else
    "$@" inspect --format "$_cif" "$_cin"
  fi
}
# cvs_docker MODE ARGS…: `RUNTIME ARGS` (MODE direct) or `sudo -n RUNTIME ARGS`.
cvs_docker() {
  if [ "$1" = direct ]; then
    shift
    "$cvs_rt" "$@"
  else
    shift
    sudo -n "$cvs_rt" "$@"
  fi
}
