#!/bin/bash
# Default container setup script shipped with cvs-orchestrator.
#
# Makes sure the container has an OpenSSH server (/usr/sbin/sshd), so MPI ranks
# can reach each other across hosts. The orchestrator configures and starts
# sshd itself afterwards; this script only installs it. Safe to run again:
# it exits at once when sshd is already there.
set -euo pipefail

if [ -x /usr/sbin/sshd ]; then
    echo "cvs-setup: /usr/sbin/sshd already installed; nothing to do"
    exit 0
fi

# Package managers run as root inside the container; sudo is neither needed
# nor usually present.
if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    echo "cvs-setup: installing openssh-server with apt-get"
    apt-get update
    apt-get install -y --no-install-recommends openssh-server
elif command -v dnf >/dev/null 2>&1; then
    echo "cvs-setup: installing openssh-server with dnf"
    dnf install -y openssh-server
elif command -v yum >/dev/null 2>&1; then
    echo "cvs-setup: installing openssh-server with yum"
    yum install -y openssh-server
elif command -v zypper >/dev/null 2>&1; then
    echo "cvs-setup: installing openssh with zypper"
    zypper --non-interactive install openssh-server || zypper --non-interactive install openssh
elif command -v apk >/dev/null 2>&1; then
    echo "cvs-setup: installing openssh-server with apk"
    apk add --no-cache openssh-server
else
    echo "cvs-setup: no supported package manager (apt-get, dnf, yum, zypper, apk) found;" \
        "use an image with openssh-server or give container.setup_script" >&2
    exit 1
fi

if [ ! -x /usr/sbin/sshd ]; then
    echo "cvs-setup: package installed but /usr/sbin/sshd is still missing" >&2
    exit 1
fi
echo "cvs-setup: openssh-server installed"
