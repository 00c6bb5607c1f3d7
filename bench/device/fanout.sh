#!/bin/bash
# Run on the GPU machine from the project's root, after bench/device/prepare.sh
# filled .device-carry/ (and copied this file into it): bash .device-carry/fanout.sh ARGS
# ARGS go to bench/fanout.py (e.g. --hosts 1000,5000 --rounds 1 --reuse-rounds 3).
set -u
C=$(cd "$(dirname "$0")" && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$C"/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
# That machine's environment sets PYTHONDONTWRITEBYTECODE=1: every process (every
# worker) would compile its modules anew (~1.5 s of CPU each). Compile once, as
# a user's pip install does.
unset PYTHONDONTWRITEBYTECODE
python3 -m compileall -q -j 0 /tmp/site orchestrator bench >/dev/null 2>&1
for f in "$C"/deb/*.deb; do dpkg -x "$f" /tmp/ossh; done
for l in "$C"/libs/*; do
  [ -e "/usr/lib/x86_64-linux-gnu/${l##*/}" ] || [ -e "/lib/x86_64-linux-gnu/${l##*/}" ] \
    || cp "$l" /usr/lib/x86_64-linux-gnu/
done
ldconfig
[ -x /usr/sbin/sshd ] || ln -sf /tmp/ossh/usr/sbin/sshd /usr/sbin/sshd
command -v ssh-keygen >/dev/null || ln -sf /tmp/ossh/usr/bin/ssh-keygen /usr/local/bin/ssh-keygen
id sshd >/dev/null 2>&1 || useradd -r -d /run/sshd -s /usr/sbin/nologin sshd
ulimit -n "$(ulimit -Hn)"
echo "$(nproc) cores, nofile $(ulimit -n), $(/usr/sbin/sshd -V 2>&1 | head -1)"
python3 bench/fanout.py "$@"
