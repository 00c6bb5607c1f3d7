# shellcheck shell=sh
# Library (prepended to probe.sh, never run alone), for rootless podman: which cgroup
# version the host runs and, on v2, the controllers the login user's cgroup
# offers. Rootless podman applies a resource cap only through a delegated
# controller; on v1 it applies none ("Resource limits are not supported and
# ignored on cgroups V1 rootless systems"). Builtins only.
cvs_cgroup_facts() {
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    _cgp=
    while IFS=: read -r _cgh _cgc _cgl; do
      [ "$_cgh" = 0 ] && [ -z "$_cgc" ] && _cgp=$_cgl
    done </proc/self/cgroup
    _ctl=
    if [ -r "/sys/fs/cgroup$_cgp/cgroup.controllers" ]; then
      read -r _ctl <"/sys/fs/cgroup$_cgp/cgroup.controllers"
    fi
    printf '@@cvs:cgroup v2 %s\n' "$_ctl"
  else
    printf '@@cvs:cgroup v1\n'
  fi
}
