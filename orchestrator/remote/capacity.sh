# Library (prepended to a program, never run alone): the host's capacity.
#
# cvs_capacity ONLINE MEMINFO: prints `@@cvs:capacity CPUS MEMTOTAL_KB` (`-`
# for what the host does not say), from the online-CPU list ONLINE
# (/sys/devices/system/cpu/online) and MEMINFO (/proc/meminfo). Builtins only
# (nproc only when the list is unreadable), and nothing in either file can end
# the shell.
cvs_capacity() {
  cpus=0
  if IFS= read -r _online 2>/dev/null <"$1"; then
    # "0-15" or "0-3,8-11": count them with builtins, no process.
    _ifs=$IFS
    IFS=,
    for _r in $_online; do
      _a=${_r%-*} _b=${_r#*-}
      # Plain decimal numbers only (no sign, no leading zero): nothing here
      # can make the arithmetic fail, which would end the shell.
      case $_a.$_b in
        *[!0-9.]* | .* | *. | 0[0-9]* | *.0[0-9]*) cpus= ; break ;;
      esac
      if [ ${#_a} -gt 6 ] || [ ${#_b} -gt 6 ]; then cpus=''; break; fi
      cpus=$((cpus + _b - _a + 1))
    done
    IFS=$_ifs
  else
    cpus=
  fi
  [ -n "$cpus" ] && [ "$cpus" != 0 ] || cpus=$(nproc 2>/dev/null) || cpus=
  mem='' _k=''
  read -r _k mem _ 2>/dev/null <"$2"
  [ "$_k" = MemTotal: ] || mem=
  case $cpus in '' | *[!0-9]*) cpus=- ;; esac
  case $mem in '' | *[!0-9]*) mem=- ;; esac
  printf '@@cvs:capacity %s %s\n' "$cpus" "$mem"
}
