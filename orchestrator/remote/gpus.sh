# The host's GPU facts, in marked sections (parsed by limits/gpus.py).
#
#   gpus.sh ROOT MARKER [MAXFILES MAXBYTES]
#
# ROOT relocates the /dev and /sys lookups (the sandbox's stand-in devices;
# "" for /); the smi tools are run as they are. Missing tools are skipped
# silently; a newline precedes every marker, so output without a final
# newline cannot swallow one. The smi queries are mirrored by limits/gpus.py
# (NVIDIA_QUERY, AMD_SMI_QUERY, ROCM_SMI_QUERY; a test compares them).
r=$1 m=$2 max_files=${3:-32} max_bytes=${4:-262144}
section() { printf '\n%s %s\n' "$m" "$1"; }
section kfd
if [ -c "$r/dev/kfd" ]; then printf '%s\n' "$r/dev/kfd"; fi
section render
for f in "$r"/dev/dri/renderD*; do
  [ -c "$f" ] || continue
  n=${f##*/}
  d="$r/sys/class/drm/$n/device"
  bdf=- vendor=-
  if [ -d "$d" ]; then
    bdf=$(cd -P "$d" 2>/dev/null && pwd -P)
    bdf=${bdf##*/}
    bdf=${bdf:--}
    vendor=$(cat "$d/vendor" 2>/dev/null)
    vendor=${vendor:--}
  fi
  printf '%s %s %s\n' "$f" "$bdf" "$vendor"
done
if command -v nvidia-smi >/dev/null 2>&1; then
  section nvidia-smi
  nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id --format=csv,noheader,nounits 2>/dev/null
fi
if command -v amd-smi >/dev/null 2>&1; then
  section amd-smi
  amd-smi static --json 2>/dev/null
elif command -v rocm-smi >/dev/null 2>&1; then
  section rocm-smi
  rocm-smi --showproductname --showmeminfo vram --showbus --json 2>/dev/null
fi
# CDI specs (limits/cdi.py): where the runtime reads them, not under ROOT.
# Bounded: at most MAXFILES files, MAXBYTES bytes each.
n=0
for f in /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json; do
  if [ ! -f "$f" ] || [ ! -r "$f" ]; then continue; fi
  n=$((n + 1))
  [ "$n" -le "$max_files" ] || break
  section "cdi $f"
  head -c "$max_bytes" "$f"
done
section end
exit 0
