# shellcheck shell=sh
# Library (prepended to probe.sh, never run alone): the probe's inspect for
# `container.runtime: podman`.
#
# podman_inspect NAME IMAGE -- PODMAN-ARGV...   (IMAGE may be empty)
#
# Prints what docker's `inspect --format INSPECT_FORMAT NAME IMAGE` prints, so
# the probe frames and parses one shape for both runtimes:
#   F ID PID RUNNING      the container's facts line (when it exists)
#   J {...}               each object found, container first, on one line
#   Error: No such object: ARG    for each one that does not exist
# podman cannot take docker's single call: a format template is evaluated
# against the container and the image types alike and fails on the image
# ("can't evaluate field State"). Succeeds when podman answered for both
# (what it did not find is absent); otherwise exits with podman's status and
# its error text, so the caller tries the next access.
podman_inspect() {
  _pn=$1 _pi=$2
  shift 3
  _prc=0
  # stdout straight through; stderr captured to tell "absent" from a failure.
  { _pe=$("$@" container inspect --format 'F {{.Id}} {{.State.Pid}} {{.State.Running}}{{println}}J {{json .}}' "$_pn" 2>&1 1>&3 3>&-); _pc=$?; } 3>&1
  if [ "$_pc" -ne 0 ]; then
    case $_pe in
      *"no such container"*) printf 'Error: No such object: %s\n' "$_pn" ;;
      *) printf '%s\n' "$_pe"; _prc=$_pc ;;
    esac
  elif [ -n "$_pe" ]; then
    printf '%s\n' "$_pe"
  fi
  [ -n "$_pi" ] || return "$_prc"
  { _pe=$("$@" image inspect --format 'J {{json .}}' "$_pi" 2>&1 1>&3 3>&-); _pc=$?; } 3>&1
  if [ "$_pc" -ne 0 ]; then
    case $_pe in
      *"image not known"*|*"no such image"*) printf 'Error: No such object: %s\n' "$_pi" ;;
      *) printf '%s\n' "$_pe"; [ "$_prc" -ne 0 ] || _prc=$_pc ;;
    esac
  elif [ -n "$_pe" ]; then
    printf '%s\n' "$_pe"
  fi
  return "$_prc"
}
