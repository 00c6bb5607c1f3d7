# Why did a command in a container fail? Facts only, one line each; cvs
# decides what they mean (containers/causes.py, `read_diagnosis`). Run after
# a command in the container ended with no exit status, or one that docker or
# a signal gives (125, 128+N). Lib access.sh prepended.
#
#   diagnose.sh [--podman|--podman-rootless] NAME
#
#   now EPOCH                  the host's clock, to place StartedAt/FinishedAt
#   state ID STATUS OOMKILLED EXITCODE STARTEDAT FINISHEDAT RESTARTS
#   error TEXT                 the runtime could not say (daemon down, no such container)
case $1 in --podman | --podman-rootless) cvs_runtime "$1"; shift ;; esac
name=$1
printf 'now %s\n' "$(date +%s)"
# Times as docker prints them (RFC 3339, one word): podman's are Go times,
# whose default text has spaces in it, so podman formats them.
cvs_time_format
# shellcheck disable=SC2154  # cvs_tf: set by cvs_time_format (access.sh)
fmt="{{.Id}} {{.State.Status}} {{.State.OOMKilled}} {{.State.ExitCode}} {{.State.StartedAt$cvs_tf}} {{.State.FinishedAt$cvs_tf}} {{.RestartCount}}"
cvs_docker_order
first=
# shellcheck disable=SC2154  # cvs_order: set by cvs_docker_order
for m in $cvs_order; do
  if out=$(cvs_docker "$m" inspect --type container -f "$fmt" "$name" 2>&1); then
    printf 'state %s\n' "$out"
    exit 0
  fi
  # The first access's answer is the one to report (sudo's refusal says less).
  [ -n "$first" ] || first=$out
done
# One line: the runtime's message may span several.
printf 'error %s\n' "$(printf '%s' "$first" | tr '\n' ' ')"
