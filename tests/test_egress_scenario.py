"""The design's own scenario, end to end, on the egress sandbox (its containers
reach Debian's mirrors): `cvs up` on an image without sshd installs it with the
packaged default setup script, starts it, and the next `cvs up` attaches."""

from __future__ import annotations

import json
import random
import subprocess
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from clitools import cvs_on

from orchestrator.sandbox import BASE_TAG, Sandbox

HOST = "egress1"


# apt-get update + install on a cold mirror can take minutes.
cvs = partial(cvs_on, timeout=900)


def report(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    docs = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert docs, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return docs[-1]


def test_cold_start_without_sshd_installs_it_and_the_next_up_attaches(
    egress_sandbox: Sandbox, tmp_path: Path
) -> None:
    assert egress_sandbox.egress_cluster_file is not None
    name = f"cvs-egress-{uuid.uuid4().hex[:8]}"
    doc = yaml.safe_load(egress_sandbox.egress_cluster_file.read_text())
    doc["state_dir"] = str(tmp_path / "state")
    doc["container"] = {
        "image": BASE_TAG,  # debootstrap minbase: no openssh-server
        "name": name,
        "lifetime": "persistent",
        "start_timeout": 800,
        # The egress host shares this machine's network namespace: a port of our own,
        # below the ephemeral range (32768-60999): an outgoing connection holding the
        # port would let sshd bind only its IPv6 listener, and IPv4 peers are refused.
        "sshd": {"enabled": True, "port": random.randint(21000, 29000)},
        "resources": {"cpus": 1, "memory": "1Gi"},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    docker = [*egress_sandbox.docker_argv(HOST)]
    try:
        first = cvs(path, "--json", "up")
        cold = report(first)
        assert first.returncode == 0, first.stderr
        steps = cold["hosts"][HOST]["steps"]
        assert cold["hosts"][HOST]["action"] == "cold_start"
        assert steps.get("provision") == "ok" and steps.get("sshd") == "ok", steps
        has_sshd = subprocess.run([*docker, "exec", name, "test", "-x", "/usr/sbin/sshd"])
        assert has_sshd.returncode == 0  # installed by the default setup script

        second = cvs(path, "--json", "up")
        attach = report(second)
        assert second.returncode == 0, second.stderr
        assert attach["hosts"][HOST]["action"] == "attach"
        # Provisioned already (the marker matches the script): not run again.
        assert "provision" not in attach["hosts"][HOST]["steps"], attach

        # mpirun-style: ssh from the container to the peer named in the hostfile
        # (here the one host itself), strict host keys, the cluster's key.
        hop = cvs(path, "exec", "--", f"ssh {HOST} 'echo hop-ok from $(id -un)'")
        assert hop.returncode == 0, hop.stdout + hop.stderr
        assert "hop-ok from root" in hop.stdout
    finally:
        subprocess.run([*docker, "rm", "-f", name], capture_output=True)
        for lock in Path("/tmp").glob(f"cvs-{name}-*.lock"):
            lock.rmdir() if lock.is_dir() else lock.unlink(missing_ok=True)
