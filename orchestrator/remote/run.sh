# Inside the container: run one `cvs exec` command so that it can be stopped.
#
#   run.sh PIDFILE TOKEN CMD…
#
# The shell records its pid in PIDFILE for kill_tree.sh and stays the
# command's parent, so that it removes PIDFILE when the command ends and exits
# with its status (a command that ends normally leaves no file behind).
# TOKEN non-empty: stdin starts with an environment block (ssh/envpass.py's
# env_block: `export K='V'` lines, then TOKEN alone on a line), read and
# evaluated before the command starts; the rest of stdin is the command's.
# - The command is exec'd from a subshell: it is the program named, never a
#   builtin (`exit`, `exec`) that would skip the clean-up.
# - The shell's own stderr is /dev/null while it waits, since shells report a
#   child killed by a signal ("Killed"); the command gets the real stderr
#   through fd 3.
# - After the block only positional parameters: it may export any name.
# - (issue 22) The container's memory cgroup `oom_kill` counter (v2
#   memory.events, v1 memory.oom_control) is read with builtins before and
#   after the command; when it grew, one line starting with
#   containers/causes.py's OOM_LINE on stderr says the out-of-memory killer
#   struck while the command ran (its exit code alone, 137, does not). Read
#   before the block, so the command's environment stays what was sent.
echo $$ >"$1"
__cvs_oom() {
  __cvs_n=-
  for __cvs_f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
    [ -r "$__cvs_f" ] || continue
    while read -r __cvs_k __cvs_v; do
      [ "$__cvs_k" = oom_kill ] && __cvs_n=$__cvs_v
    done <"$__cvs_f"
  done
}
__cvs_oom
__cvs_o=$__cvs_n
if [ -n "$2" ]; then
  __cvs_e=''
  while IFS= read -r __cvs_l; do
    [ "$__cvs_l" = "$2" ] && break
    __cvs_e="$__cvs_e$__cvs_l
"
  done
  eval "$__cvs_e"
  unset __cvs_e __cvs_l
fi
{ (shift 2; exec "$@" 2>&3 3>&-); set -- "$?" "$1"; rm -f "$2"; } 3>&2 2>/dev/null
__cvs_oom
if [ "$__cvs_o" != - ] && [ "$__cvs_n" != "$__cvs_o" ]; then
  echo "cvs: out of memory: memory cgroup oom_kill $__cvs_o -> $__cvs_n" >&2
fi
exit "$1"
