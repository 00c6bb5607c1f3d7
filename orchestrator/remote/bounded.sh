# Run one host step (docker login, pull, load) so that a timeout stops all of
# it.
#
#   bounded.sh CMD…
#
# On a timeout cvs sends TERM to the session's process group (sshd's signal
# request), then KILL while the session is open. But sshd forgets the group
# once the session's first process exits, and the docker CLI outlives a
# single TERM (it cancels its context and waits; a third signal ends it): so
# a plain `docker login` left running on the host with no one to stop it. Here
# the shell stays the session's first process, runs CMD in the background,
# and on TERM, HUP or INT signals the whole group three times, then KILLs it
# (itself included). A background job's stdin is /dev/null unless redirected,
# and `0<&0` redirects from it (dash, busybox): the channel's stdin goes to
# CMD through fd 4.
exec 4<&0
"$@" <&4 4<&- &
child=$!
exec 4<&-
trap 'trap "" TERM HUP INT; kill -TERM 0; kill -TERM 0; kill -TERM 0; sleep 0.3; kill -KILL 0' TERM HUP INT
wait "$child"
