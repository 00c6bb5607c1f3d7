"""Set-up time of a CVS suite's `orch` fixture: ours, and CVS's sequence replayed.

    python bench/cvs_setup.py --sandbox-hosts 4 --rounds 3      # root: builds a sandbox

What CVS's conftest does before a suite's first test is
`setup_containers()` then `setup_sshd()`. Measured here on a throwaway
sandbox (a netns, sshd and dockerd per host), from a CVS cluster JSON with
`enabled`/`launch` true:

- ours, first run: `CvsOrchestrator` cold-starts the persistent containers
  (lock + probe, run, setup script, in-container sshd with per-cluster keys);
- ours, next run: a new orchestrator (new connections, as a new `cvs run`
  process) attaches: the install is kept;
- CVS's sequence, replayed: the commands CVS's ContainerOrchestrator and
  ContainerRuntime send (image check, `docker rm -f`, `docker run`, the six
  `setup_sshd` commands, its 2 s sleep, the `pgrep` check), each a blocking
  fan-out through parallel-ssh's ParallelSSHClient, the client CVS uses.
  CVS itself is not installable here (not on PyPI): this is a replay of its
  command sequence from its source, not CVS's code. Every run of it starts the
  container anew (CVS removes a same-named container first), so its first
  and next runs cost the same. Deviations, each forced by the sandbox: no
  `sudo` (the login user is in the docker group), no `--privileged`, no
  memlock ulimit, no `--device` (the sandbox has no GPUs; CVS passes them
  unconditionally), `~/.ssh` replaced by a scratch directory with a dummy key.

Prints medians per phase; `--json` for one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.api import Cluster
from orchestrator.compat.config import cluster_from_files, keys_from_files
from orchestrator.compat.cvs import CvsOrchestrator
from orchestrator.sandbox import DOCKER_USER, SSHD_TAG, Sandbox

log = logging.getLogger("bench.cvs_setup")
CVS_SSHD_COMMANDS = [
    "mkdir -p /root/.ssh",
    "bash -c 'cp -r /host_ssh/* /root/.ssh/'",
    "chown -R root:root /root/.ssh",
    "bash -c 'chmod 700 /root/.ssh && chmod 600 /root/.ssh/*'",
    "mkdir -p /run/sshd",
    "/usr/sbin/sshd -p2224",
]


def cvs_cluster_json(sb: Sandbox, directory: Path, name: str) -> Path:
    doc = {
        "orchestrator": "container",
        "username": DOCKER_USER,
        "priv_key_file": str(sb.key_file),
        "node_dict": {h.address: {"bmc_ip": "NA", "vpc_ip": h.address} for h in sb.nodes},
        "name": f"bench-{name}",
        "state_dir": str(directory / "state"),
        "ssh": {"known_hosts": str(sb.known_hosts), "use_ssh_config": False},
        "container": {
            "image": SSHD_TAG,
            "name": name,
            "enabled": True,
            "launch": True,
            "runtime": {
                "name": "docker",
                "args": {"privileged": False, "ulimit": ["memlock=8388608"]},
            },
        },
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def ours_setup(cluster_file: Path) -> tuple[float, bool]:
    keys = keys_from_files(str(cluster_file), None)
    start = time.perf_counter()
    orch = CvsOrchestrator(log, SimpleNamespace(**keys), cluster_file=str(cluster_file))
    ok = orch.setup_containers() and orch.setup_sshd()
    seconds = time.perf_counter() - start
    orch.teardown_containers()  # persistent: keeps them; closes the connections
    return seconds, ok


def ours_remove(cluster_file: Path) -> None:
    cluster = cluster_from_files(str(cluster_file), None)

    async def down() -> None:
        async with Cluster.open(cluster) as c:
            await c.down(force=True)

    anyio.run(down)


def _fan_out(client: Any, cmd: str, timeout: float | None = None) -> dict[str, int | None]:
    """One blocking fan-out, read to the end on every host (CVS's _process_output)."""
    output = client.run_command(cmd, stop_on_errors=False, read_timeout=timeout)
    for item in output:
        for _ in item.stdout or []:
            pass
        for _ in item.stderr or []:
            pass
    client.join(output)
    return {item.host: item.exit_code for item in output}


def cvs_replay(sb: Sandbox, name: str, keydir: Path) -> tuple[float, bool]:
    from pssh.clients import ParallelSSHClient

    hosts = [h.address for h in sb.nodes]
    start = time.perf_counter()
    client = ParallelSSHClient(hosts, user=DOCKER_USER, pkey=str(sb.key_file), keepalive_seconds=30)
    image_check = (
        f"docker images --format '{{{{.Repository}}}}:{{{{.Tag}}}}' | grep -q '^{SSHD_TAG}$'"
    )
    _fan_out(client, image_check, 30)
    _fan_out(client, f"docker rm -f {name} || true", 30)
    run = [
        "docker", "run", "-d", "--name", name, "--network", "host",
        "-v", f"{keydir}:/host_ssh", "-e", "GPUS=8", "-e", "MULTINODE=true",
        "--cap-add", "SYS_PTRACE", "--cap-add", "IPC_LOCK", "--cap-add", "SYS_ADMIN",
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--group-add", "video", "--ipc", "host", "--ulimit", "memlock=8388608",
        SSHD_TAG, "sleep", "infinity",
    ]  # fmt: skip
    ok = all(code == 0 for code in _fan_out(client, shlex.join(run), 120).values())
    for cmd in CVS_SSHD_COMMANDS:
        codes = _fan_out(client, f"docker exec {name} bash -c {shlex.quote(cmd)}", 10)
        ok = ok and all(code == 0 for code in codes.values())
    time.sleep(2)  # CVS: "Wait for sshd to start"
    pgrep = "pgrep -f 'sshd.*2224' > /dev/null 2>&1"
    check = f"docker exec {name} bash -c {shlex.quote(pgrep)}"
    pgrep_ok = all(code == 0 for code in _fan_out(client, check, 10).values())
    seconds = time.perf_counter() - start
    return seconds, ok and pgrep_ok


def cvs_remove(sb: Sandbox, name: str) -> None:
    from pssh.clients import ParallelSSHClient

    client = ParallelSSHClient(
        [h.address for h in sb.nodes], user=DOCKER_USER, pkey=str(sb.key_file)
    )
    _fan_out(client, f"docker rm -f {name} 2>/dev/null || true", 30)


def measure(sb: Sandbox, directory: Path, rounds: int) -> dict[str, Any]:
    keydir = directory / "host_ssh"
    keydir.mkdir()
    (keydir / "id_dummy").write_text("dummy: the replay copies ~/.ssh as CVS does\n")
    phases: dict[str, list[float]] = {"ours_first": [], "ours_next": [], "cvs_replay": []}
    oks: dict[str, list[bool]] = {k: [] for k in phases}
    for n in range(rounds):
        cluster = cvs_cluster_json(sb, directory, f"bench-ours-{n}")
        try:
            for phase in ("ours_first", "ours_next"):
                seconds, ok = ours_setup(cluster)
                phases[phase].append(seconds)
                oks[phase].append(ok)
        finally:
            ours_remove(cluster)
        name = f"bench-cvs-{n}"
        try:
            seconds, ok = cvs_replay(sb, name, keydir)
            phases["cvs_replay"].append(seconds)
            oks["cvs_replay"].append(ok)
        finally:
            cvs_remove(sb, name)
    return {
        "hosts": len(sb.nodes),
        "rounds": rounds,
        "median_seconds": {k: round(statistics.median(v), 2) for k, v in phases.items()},
        "all_seconds": {k: [round(x, 2) for x in v] for k, v in phases.items()},
        "ok": {k: all(v) for k, v in oks.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandbox-hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from orchestrator.sandbox import sandbox_down, sandbox_up

    with tempfile.TemporaryDirectory(prefix="cvs-bench-setup-") as tmp:
        directory = Path(tmp)
        try:
            sb = sandbox_up(directory / "sb", args.sandbox_hosts)
            result = measure(sb, directory, args.rounds)
        finally:
            sandbox_down(directory / "sb")
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        med, ok = result["median_seconds"], result["ok"]
        sys.stdout.write(f"{result['hosts']} hosts, median of {result['rounds']}:\n")
        for key, label in (
            ("ours_first", "ours, first run (cold start)"),
            ("ours_next", "ours, next run (attach)"),
            ("cvs_replay", "CVS's sequence, every run"),
        ):
            sys.stdout.write(f"  {label:<30} {med[key]:6.2f} s  ok={ok[key]}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
