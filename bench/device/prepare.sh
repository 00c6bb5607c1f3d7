#!/bin/bash
# Fill .device-carry/ (in the current directory, the project's root) with what
# the GPU machine lacks for bench/fanout.py: cp312 wheels and an OpenSSH server.
set -euo pipefail
C=.device-carry
mkdir -p "$C/whl" "$C/deb" "$C/libs"
cp bench/device/fanout.sh "$C/"
grep -qx "/$C/" .git/info/exclude 2>/dev/null || echo "/$C/" >> .git/info/exclude
plat=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  plat+=(--platform "${p}_x86_64")
done
# The project's runtime dependencies and parallel-ssh's, at the versions a
# fresh venv here resolves (the device has anyio, pyyaml, rich, jinja2).
pkgs=(asyncssh tenacity cryptography cffi pycparser pydantic pydantic-core annotated-types
      typing-inspection ClusterShell shtab parallel-ssh ssh2-python ssh-python
      gevent greenlet zope.event zope.interface)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" -d "$C/whl" "${pkgs[@]}"
(cd "$C/deb" && apt-get download openssh-server openssh-client openssh-sftp-server libwrap0 >/dev/null 2>&1)
# sshd's shared libraries, for those the device does not have (glibc is newer there).
ldd /usr/sbin/sshd | awk '/=>/ {print $3}' \
  | grep -v -E 'libc\.so|ld-linux|libm\.so|libpthread|libdl\.so|libresolv' \
  | while read -r l; do cp -L "$l" "$C/libs/"; done
du -sh "$C"
