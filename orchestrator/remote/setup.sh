# Inside the container, as root: receive and run the setup script.
#
#   setup.sh SHA256 MARKER      (stdin: the script, base64)
#
# The script only ever arrives on stdin, so there is no argv size limit and it
# never shows in `ps`. It is decoded, checked against SHA256 (a corrupted
# payload is refused, not run), run with `bash -o pipefail` (else `sh`, saying
# so), and only on success is MARKER written (atomically) with SHA256: any
# failure leaves no marker, so the next `up` provisions again instead of
# attaching to a half-built container. The exit codes below are mirrored by
# orchestrator/containers/provision.py (a test compares them).
EXIT_MISSING_TOOL=90 # base64 / sha256sum missing in the image
EXIT_BAD_PAYLOAD=91  # payload not decodable
EXIT_CHECKSUM=92     # decoded script's sha256 differs: refused, not run
EXIT_MARKER=93       # script ran, marker could not be written

sha=$1 marker=$2
umask 077
missing=''
for tool in base64 sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then
  echo "cvs: the container image lacks:$missing (needed to receive the setup script)" >&2
  exit $EXIT_MISSING_TOOL
fi
# Whatever happens next, a previous marker no longer describes this container.
rm -f "$marker"
dir=$(mktemp -d 2>/dev/null) ||
  { dir=/tmp/cvs-setup.$$; mkdir "$dir" || exit $EXIT_BAD_PAYLOAD; }
trap 'rm -rf "$dir"' EXIT
trap 'exit 143' HUP INT TERM
if ! base64 -d >"$dir/script"; then
  echo "cvs: could not decode the setup script payload (base64)" >&2
  exit $EXIT_BAD_PAYLOAD
fi
got=$(sha256sum <"$dir/script") || exit $EXIT_MISSING_TOOL
got=${got%% *}
if [ "$got" != "$sha" ]; then
  echo "cvs: setup script checksum mismatch: expected $sha, got $got; refusing to run it" >&2
  exit $EXIT_CHECKSUM
fi
# For setup_kill.sh: a timed-out script is stopped by its process group.
echo $$ >/tmp/cvs-setup.pid 2>/dev/null
# pipefail is tried: a shell that lacks it takes the last branch.
# shellcheck disable=SC3040
if command -v bash >/dev/null 2>&1; then
  bash -o pipefail "$dir/script" </dev/null
  rc=$?
elif (set -o pipefail) 2>/dev/null; then
  echo "cvs: bash not found in the container; running the setup script with sh -o pipefail" >&2
  sh -o pipefail "$dir/script" </dev/null
  rc=$?
else
  echo "cvs: bash not found in the container; running the setup script with sh (no pipefail)" >&2
  sh "$dir/script" </dev/null
  rc=$?
fi
rm -f /tmp/cvs-setup.pid
if [ "$rc" -ne 0 ]; then
  echo "cvs: setup script failed with exit code $rc; container not marked as provisioned" >&2
  exit "$rc"
fi
tmpmark="$marker.tmp.$$"
# Readable by the image's user: the probe reads the marker as that user.
if mkdir -p "${marker%/*}" && chmod 755 "${marker%/*}" &&
    printf '%s\n' "$sha" >"$tmpmark" && chmod 644 "$tmpmark" &&
    mv -f "$tmpmark" "$marker"; then
  echo "cvs: provisioned, marker $sha"
  exit 0
fi
rm -f "$tmpmark" "$marker"
echo "cvs: setup script succeeded but the marker $marker could not be written" >&2
exit $EXIT_MARKER
