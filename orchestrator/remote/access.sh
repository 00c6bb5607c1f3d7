# Library (prepended to a program, never run alone): how this host reaches
# docker, the one rule cvs follows wherever the probe has not already said.
#
# cvs_docker_order: sets cvs_order to "direct sudo" or "sudo direct": plain
# `docker` first, unless the socket's permissions say it cannot work (then
# `sudo -n docker` first). Costs no process.
#
# One Go thread per docker client: its start-up costs less CPU.
GOMAXPROCS=1
export GOMAXPROCS
# shellcheck disable=SC2034  # cvs_order: read by the program this is prepended to
cvs_docker_order() {
  cvs_order="direct sudo"
  case ${DOCKER_HOST:-unix:///var/run/docker.sock} in
    unix://*)
      _cvs_sock=${DOCKER_HOST:-unix:///var/run/docker.sock}
      _cvs_sock=${_cvs_sock#unix://}
      if [ -S "$_cvs_sock" ] && [ ! -w "$_cvs_sock" ]; then cvs_order="sudo direct"; fi ;;
  esac
}
# cvs_docker MODE ARGS…: `docker ARGS` (MODE direct) or `sudo -n docker ARGS`.
cvs_docker() {
  if [ "$1" = direct ]; then
    shift
    docker "$@"
  else
    shift
    sudo -n docker "$@"
  fi
}
