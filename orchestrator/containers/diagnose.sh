# Why did a command in a container fail? Facts only, one line each; cvs
# decides what they mean (containers/causes.py, `read_diagnosis`).
# $1: the container name. Run by `sh -c` after a step in the container ended
# with no exit status, or one docker or a signal gives (125, 128+N).
#
#   now EPOCH                  the host's clock, to place StartedAt/FinishedAt
#   state ID STATUS OOMKILLED EXITCODE STARTEDAT FINISHEDAT RESTARTS
#   error TEXT                 docker could not say (daemon down, no such container)
name=$1
GOMAXPROCS=1
export GOMAXPROCS
printf 'now %s\n' "$(date +%s)"
fmt='{{.Id}} {{.State.Status}} {{.State.OOMKilled}} {{.State.ExitCode}} {{.State.StartedAt}} {{.State.FinishedAt}} {{.RestartCount}}'
if out=$(docker inspect --type container -f "$fmt" "$name" 2>&1); then
  printf 'state %s\n' "$out"
  exit 0
fi
case $out in
  *ermission*)
    if again=$(sudo -n docker inspect --type container -f "$fmt" "$name" 2>&1); then
      printf 'state %s\n' "$again"
      exit 0
    fi
    out=$again
    ;;
esac
# One line: docker's message may span several.
printf 'error %s\n' "$(printf '%s' "$out" | tr '\n' ' ')"
