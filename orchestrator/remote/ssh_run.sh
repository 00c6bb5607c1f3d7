# Inside the container, started by the container's sshd (containers/sshexec.py):
# make the login session what `docker exec` would have given, then run CMD.
#
#   ssh_run.sh WORKDIR NOCD_EXIT PIDFILE TOKEN CMD…
#
# sshd gives a session variables of its own, starts it in the user's home and
# with the sshd's umask (077: remote/sshd.sh starts sshd under that umask);
# `docker exec` gives the container's environment, the image's WORKDIR and
# umask 022. So: drop what sshd (and a bash login shell) added, take docker's
# umask, change to WORKDIR (exit NOCD_EXIT when it cannot: the runtime's own
# code for that, 126 from docker, 127 from podman). remote/run.sh's text
# follows this one in the same shell (remote.program), with PIDFILE TOKEN
# CMD… as its arguments; its stdin block carries the container's
# environment, read on the host once per invocation. Only names here: no
# value ever reaches an argv.
unset USER LOGNAME MAIL SHELL SSH_CLIENT SSH_CONNECTION SSH_TTY SSH_AUTH_SOCK SHLVL _
umask 022
if ! cd "$1" 2>/dev/null; then
  echo "cvs: cannot change to the working directory $1 in the container (missing, or not allowed for this user)" >&2
  exit "$2"
fi
unset OLDPWD
shift 2
