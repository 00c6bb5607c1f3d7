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
echo $$ >"$1"
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
exit "$1"
