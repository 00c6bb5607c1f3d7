# Why did a command in a container fail? Facts only, one line each; cvs
# decides what they mean (containers/causes.py, `read_diagnosis`). Run after
# a command in the container ended with no exit status, or one that docker or
# a signal gives (125, 128+N). Lib access.sh prepended.
#
#   diagnose.sh [--podman|--podman-rootless] NAME [PIDFILE]
#
#   now EPOCH                  the host's clock, to place StartedAt/FinishedAt
#   state ID STATUS OOMKILLED EXITCODE STARTEDAT FINISHEDAT RESTARTS
#   pidfile left MTIME | pidfile gone
#                              (with PIDFILE, a running container, "running"
#                              checked by starting a process in it) the command's
#                              run.sh records its pid there when it starts and
#                              removes it when the command ends: left behind,
#                              run.sh itself was killed; MTIME (epoch seconds,
#                              the same clock as StartedAt) is when the command
#                              started. Removed once read.
#   error TEXT                 the runtime could not say (daemon down, no such container)
case $1 in --podman | --podman-rootless) cvs_runtime "$1"; shift ;; esac
name=$1 pidfile=${2-}
# In the container, as root: `left MTIME` or `gone` (date -r: GNU and busybox;
# %N where the date has it, whole seconds where it prints it literally).
# shellcheck disable=SC2016  # expanded by the container's shell, not this one
look='if [ -n "$1" ] && [ -e "$1" ]; then
  t=$(date -r "$1" +%s.%N 2>/dev/null) || t=-
  rm -f "$1"; echo "left ${t%.%N}"
else echo gone; fi'
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
    # Stopped or restarting: a restart (`docker restart`, a restart policy)
    # may be under way; look again for up to 2.5 s, so that one is told as a
    # restart rather than as the stop it begins with.
    tries=5
    while [ "$tries" -gt 0 ]; do
      case $out in *' running '*) break ;; esac
      tries=$((tries - 1))
      sleep 0.5
      again=$(cvs_docker "$m" inspect --type container -f "$fmt" "$name" 2>&1) || break
      out=$again
    done
    seen=
    case $out in
      *' running '*)
        # "running" can be stale: the runtime records a stop a moment after
        # the kernel has killed what ran in the container (the command's 137
        # can reach cvs first). A process started in it says it really runs;
        # when none can be, look again for up to 2.5 s.
        if ! seen=$(cvs_docker "$m" exec -u 0 "$name" sh -c "$look" sh "$pidfile" 2>/dev/null); then
          seen='' tries=5
          while [ "$tries" -gt 0 ]; do
            tries=$((tries - 1))
            sleep 0.5
            again=$(cvs_docker "$m" inspect --type container -f "$fmt" "$name" 2>&1) || break
            out=$again
            case $out in *' running '*) ;; *) break ;; esac
          done
        fi ;;
    esac
    printf 'state %s\n' "$out"
    if [ -n "$pidfile" ] && [ -n "$seen" ]; then
      printf 'pidfile %s\n' "$seen"
    fi
    exit 0
  fi
  # The first access's answer is the one to report (sudo's refusal says less).
  [ -n "$first" ] || first=$out
done
# One line: the runtime's message may span several.
printf 'error %s\n' "$(printf '%s' "$first" | tr '\n' ' ')"
