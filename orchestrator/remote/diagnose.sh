# Why did a command in a container fail? Facts only, one line each; cvs
# decides what they mean (containers/causes.py, `read_diagnosis`). Run after
# a command in the container ended with no exit status, or one that docker or
# a signal gives (125, 128+N). Lib access.sh prepended.
#
#   diagnose.sh NAME
#
#   now EPOCH                  the host's clock, to place StartedAt/FinishedAt
#   state ID STATUS OOMKILLED EXITCODE STARTEDAT FINISHEDAT RESTARTS
#   error TEXT                 docker could not say (daemon down, no such container)
name=$1
printf 'now %s\n' "$(date +%s)"
fmt='{{.Id}} {{.State.Status}} {{.State.OOMKilled}} {{.State.ExitCode}} {{.State.StartedAt}} {{.State.FinishedAt}} {{.RestartCount}}'
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
# One line: docker's message may span several.
printf 'error %s\n' "$(printf '%s' "$first" | tr '\n' ' ')"
