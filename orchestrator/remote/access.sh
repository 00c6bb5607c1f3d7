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
