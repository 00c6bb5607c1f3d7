"""`cvs cp` and `copy:` suite steps against the real sandbox (sshd + dockerd per host)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import CVS, REPO, last_json
from exectools import CLI_ENV, NODES, containers_up, cvs, yaml_container
from sandboxtools import cluster_variant, wait_until

from orchestrator.containers.copy import compare
from orchestrator.containers.locks import LEASE_SECONDS
from orchestrator.sandbox import Sandbox

PAYLOAD = bytes(range(256)) * 4096 + b"tail\n"  # 1 MiB + 5 bytes, every byte value


@pytest.fixture(scope="module")
def cp_cluster(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("cp")
    container = {**yaml_container(sandbox, name="cvs-t-cp"), "sshd": {"enabled": False}}
    cluster = cluster_variant(sandbox, directory, container=container)
    with containers_up(cluster):
        yield cluster


def in_container(sandbox: Sandbox, host: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sandbox.docker_argv(host), "exec", "cvs-t-cp", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_file_lands_in_every_container_with_its_checksum(
    cp_cluster: Path, sandbox: Sandbox, tmp_path: Path
) -> None:
    src = tmp_path / "blob.bin"
    src.write_bytes(PAYLOAD)
    src.chmod(0o750)
    proc = cvs("cp", "-c", str(cp_cluster), str(src), "/opt/drop/")
    assert proc.returncode == 0, proc.stderr
    for host in NODES:
        assert "/opt/drop/blob.bin: 1 file, 1.0 MiB, sha256 ok" in proc.stdout
        got = in_container(sandbox, host, "sha256sum", "/opt/drop/blob.bin").stdout.split()[0]
        assert got == hashlib.sha256(PAYLOAD).hexdigest()
        mode = in_container(sandbox, host, "stat", "-c", "%a", "/opt/drop/blob.bin").stdout
        assert mode.strip() == "750"
    assert "4 hosts: 4 ok" in proc.stdout  # the result: stdout (docs/cli-output.md)


def test_directory_to_selected_hosts_minus_excluded(
    cp_cluster: Path, sandbox: Sandbox, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("alpha\n")
    (tree / "sub" / "b.txt").write_text("beta\n")
    proc = cvs(
        "cp", "-c", str(cp_cluster), "--hosts", "node[1-3]", "-x", "node3", str(tree), "/srv/t1"
    )
    assert proc.returncode == 0, proc.stderr
    assert "/srv/t1: 2 files" in proc.stdout
    for host in ("node1", "node2"):
        cat = in_container(sandbox, host, "cat", "/srv/t1/a.txt", "/srv/t1/sub/b.txt")
        assert cat.stdout == "alpha\nbeta\n"
    for host in ("node3", "node4"):
        assert in_container(sandbox, host, "test", "-e", "/srv/t1").returncode == 1


def test_into_an_existing_directory_keeps_the_source_name(
    cp_cluster: Path, sandbox: Sandbox, tmp_path: Path
) -> None:
    tree = tmp_path / "pkg"
    tree.mkdir()
    (tree / "x").write_text("x\n")
    proc = cvs("cp", "-c", str(cp_cluster), "--hosts", "node1", str(tree), "/tmp")
    assert proc.returncode == 0, proc.stderr
    assert in_container(sandbox, "node1", "cat", "/tmp/pkg/x").stdout == "x\n"


def test_from_host_gathers_one_file_per_host(
    cp_cluster: Path, sandbox: Sandbox, tmp_path: Path
) -> None:
    for host in NODES:
        in_container(sandbox, host, "sh", "-c", f"echo from-{host} > /tmp/who.txt")
    out = tmp_path / "collected"
    proc = cvs("cp", "-c", str(cp_cluster), "--from-host", "/tmp/who.txt", str(out), "--json")
    assert proc.returncode == 0, proc.stdout
    summary = last_json(proc)
    assert {h: r["status"] for h, r in summary["hosts"].items()} == dict.fromkeys(NODES, "ok")
    for host in NODES:
        assert (out / host / "who.txt").read_text() == f"from-{host}\n"


def test_from_host_missing_file_fails_that_host_with_the_reason(
    cp_cluster: Path, tmp_path: Path
) -> None:
    proc = cvs(
        "cp", "-c", str(cp_cluster), "--hosts", "node2", "--from-host", "/nope", str(tmp_path)
    )
    assert proc.returncode == 1
    assert "node2  failed: /nope: not a regular file" in proc.stdout
    assert not (tmp_path / "node2").exists()  # no empty host directory left behind


def test_host_os_copies_onto_the_host(cp_cluster: Path, sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "h.txt"
    src.write_text("on the host\n")
    target = Path(f"/tmp/cvs-t-cp-host-{os.getpid()}")
    try:
        proc = cvs(
            "cp", "-c", str(cp_cluster), "--host-os", "--hosts", "node1", str(src), f"{target}/"
        )
        assert proc.returncode == 0, proc.stderr
        assert (target / "h.txt").read_text() == "on the host\n"  # the sandbox hosts share this fs
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_missing_source_is_exit_2_with_one_line(cp_cluster: Path, tmp_path: Path) -> None:
    proc = cvs("cp", "-c", str(cp_cluster), str(tmp_path / "missing"), "/opt/")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"cvs: cp: {tmp_path / 'missing'}: No such file or directory"
    ]


def run_cluster(sandbox: Sandbox, directory: Path) -> Path:
    """A per_run variant of its own: `cvs run` starts and removes its containers, and
    must not take cp_cluster's away from the other tests."""
    container = {**yaml_container(sandbox, name="cvs-t-cp-run"), "sshd": {"enabled": False}}
    return cluster_variant(sandbox, directory / "run-cluster", container=container)


def test_copy_step_ships_a_tarball_then_a_run_step_uses_it(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    tool = tmp_path / "tool"
    tool.mkdir()
    (tool / "hello").write_text("#!/bin/sh\necho hello from the shipped tool\n")
    (tool / "hello").chmod(0o755)
    subprocess.run(
        ["tar", "-czf", str(tmp_path / "tool.tgz"), "-C", str(tmp_path), "tool"], check=True
    )
    suite = tmp_path / "install_x.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "install_x",
                "steps": [
                    {"name": "ship", "copy": {"src": "tool.tgz", "dest": "/opt/x/"}},
                    {
                        "name": "unpack",
                        "run": "tar -xzf /opt/x/tool.tgz -C /opt/x && /opt/x/tool/hello",
                        "expect": {"stdout": "^hello from the shipped tool$"},
                    },
                ],
            }
        )
    )
    cluster = run_cluster(sandbox, tmp_path)
    proc = cvs("run", "-c", str(cluster), str(suite), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [s["status"] for s in doc["steps"]] == ["ok", "ok"]
    log = (tmp_path / "run" / "logs" / "ship" / "node1.log").read_text()
    assert "/opt/x/tool.tgz: 1 file" in log and "sha256 ok" in log


def test_copy_step_with_a_missing_source_is_exit_2_before_anything_runs(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    suite = tmp_path / "bad.yaml"
    suite.write_text(
        yaml.safe_dump(
            {"name": "bad", "steps": [{"name": "s", "copy": {"src": "no.tgz", "dest": "/x"}}]}
        )
    )
    cluster = run_cluster(sandbox, tmp_path)
    proc = cvs("run", "-c", str(cluster), str(suite), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "steps[0].copy.src:" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (["@@cvs-final:/x", "a" * 64 + "  ./f"], None),
        (["b" * 64 + "  ./f"], "sha256 differs for ./f"),
        ([], "not found after the copy: ./f"),
    ],
)
def test_compare_names_the_files_that_differ(lines: list[str], problem: str | None) -> None:
    assert compare({"./f": "a" * 64}, lines, "dir") == problem


def test_progress_reports_every_byte_sent_to_every_host(cp_cluster: Path, tmp_path: Path) -> None:
    import anyio

    from orchestrator.api import Cluster
    from orchestrator.config import load_cluster
    from orchestrator.containers.copy import Payload, copy_to_hosts

    src = tmp_path / "p.bin"
    src.write_bytes(PAYLOAD)
    seen: dict[str, int] = {}

    def progress(host: str, n: int) -> None:
        seen[host] = seen.get(host, 0) + n

    async def main() -> dict[str, object]:
        config = load_cluster(cp_cluster)
        payload = Payload.from_path(src)
        try:
            async with Cluster.open(config) as cluster:
                return await copy_to_hosts(  # type: ignore[return-value]
                    cluster.pool, config, payload, "/tmp/p.bin", hosts=NODES, progress=progress
                )
        finally:
            payload.close()

    results = anyio.run(main)
    assert all(r.ok for r in results.values()), results  # type: ignore[attr-defined]
    assert seen == dict.fromkeys(NODES, len(PAYLOAD))


def test_an_unwritable_destination_fails_that_host_with_the_remote_reason(
    cp_cluster: Path, tmp_path: Path
) -> None:
    # Large enough that the remote side gives up while cvs is still sending.
    src = tmp_path / "big.bin"
    src.write_bytes(PAYLOAD * 16)
    proc = cvs("cp", "-c", str(cp_cluster), "--hosts", "node2", str(src), "/proc/nope/")
    assert proc.returncode == 1, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("node2"))
    assert "failed:" in line and "/proc/nope" in line, line


def test_a_file_that_arrives_different_never_replaces_dest(
    cp_cluster: Path, sandbox: Sandbox, tmp_path: Path
) -> None:
    """What an interrupted or corrupted transfer looks like to the receiving side."""
    import anyio

    from orchestrator.api import Cluster
    from orchestrator.config import load_cluster
    from orchestrator.containers.copy import Payload, copy_to_hosts

    in_container(sandbox, "node3", "sh", "-c", "echo old > /tmp/keep.txt")
    src = tmp_path / "keep.txt"
    src.write_text("new\n")

    async def main() -> Any:
        config = load_cluster(cp_cluster)
        payload = Payload.from_path(src)
        payload.checksums["-"] = "0" * 64  # not what will arrive
        try:
            async with Cluster.open(config) as cluster:
                return await copy_to_hosts(
                    cluster.pool, config, payload, "/tmp/keep.txt", hosts=["node3"]
                )
        finally:
            payload.close()

    result = anyio.run(main)["node3"]
    assert result.status == "failed"
    assert "not replaced" in (result.error or "")
    assert in_container(sandbox, "node3", "cat", "/tmp/keep.txt").stdout == "old\n"
    leftovers = in_container(sandbox, "node3", "sh", "-c", "ls -a /tmp | grep cvs-cp || true")
    assert leftovers.stdout == ""


# --- a copy is whole or absent (issue 42, item 7) -------------------------------------

BIG = 40 * 2**20  # per file: long enough to be caught midway on every host


@pytest.fixture(scope="module", params=["exec", "sshd"])
def cut_cluster(
    request: pytest.FixtureRequest, sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, str]]:
    """(cluster file, container name): copies through `docker exec -i`, or
    through the containers' own sshd (containers/sshexec.py)."""
    name = f"cvs-t-cut-{request.param}"
    container = yaml_container(sandbox, name=name)
    if request.param == "exec":
        container["sshd"] = {"enabled": False}
    cluster = cluster_variant(sandbox, tmp_path_factory.mktemp(name), container=container)
    with containers_up(cluster):
        yield cluster, name


def _merged_dir(sandbox: Sandbox, host: str, name: str) -> Path:
    """The container's root filesystem as this machine sees it (docker's
    overlay): looked at without a `docker exec` per look."""
    argv = [*sandbox.docker_argv(host), "inspect", "-f", "{{.GraphDriver.Data.MergedDir}}", name]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return Path(out.stdout.strip())


def _temps(root: Path) -> list[Path]:
    """cvs's temp names under `root`: `.cvs-cp.PID` files, `.cvs-cp.PID.d` staging trees."""
    return list(root.rglob(".cvs-cp.*")) if root.exists() else []


def _bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def _interrupt_midway(
    cluster: Path, roots: dict[str, Path], src: Path, dest: str, signum: int
) -> float:
    """`cvs cp SRC DEST` to every host, sent `signum` once every host holds
    more than 1 MiB of it under `roots` (each host's DEST parent, as seen
    from here); the seconds from the signal until no temp name is left."""
    proc = subprocess.Popen(
        [*CVS, "cp", "-c", str(cluster), str(src), dest],
        env=CLI_ENV,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        midway = wait_until(lambda: all(_bytes(r) > 2**20 for r in roots.values()), 90, 0.02)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert midway, "the copy never got under way on every host"
    assert proc.returncode != 0, out
    start = time.monotonic()
    gone = wait_until(lambda: not any(_temps(r) for r in roots.values()), LEASE_SECONDS, 0.05)
    seconds = time.monotonic() - start
    left = {h: [str(p) for p in _temps(r)] for h, r in roots.items() if _temps(r)}
    assert gone, f"temp names left {LEASE_SECONDS}s after the signal: {left}"
    return seconds


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_a_directory_copy_cut_midway_leaves_no_file_under_its_final_name(
    cut_cluster: tuple[Path, str], sandbox: Sandbox, tmp_path: Path, signum: int
) -> None:
    cluster, name = cut_cluster
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for file in ("a.bin", "b.bin", "sub/c.bin"):
        with (tree / file).open("wb") as f:
            f.truncate(BIG)
    parent = f"/srv/cut-{uuid.uuid4().hex[:8]}"
    roots = {h: _merged_dir(sandbox, h, name) / parent.lstrip("/") for h in NODES}
    seconds = _interrupt_midway(cluster, roots, tree, f"{parent}/tree", signum)
    print(f"temp names gone {seconds:.2f}s after {signal.Signals(signum).name}")
    for host, root in roots.items():
        assert not (root / "tree").exists(), f"{host}: {sorted(root.rglob('*'))}"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "sigint"])
def test_a_file_copy_cut_midway_leaves_no_temp_file_and_the_old_file(
    cut_cluster: tuple[Path, str], sandbox: Sandbox, tmp_path: Path, signum: int
) -> None:
    cluster, name = cut_cluster
    src = tmp_path / "big.bin"
    with src.open("wb") as f:
        f.truncate(3 * BIG)
    parent = f"/srv/cut-{uuid.uuid4().hex[:8]}"
    roots = {h: _merged_dir(sandbox, h, name) / parent.lstrip("/") for h in NODES}
    for root in roots.values():
        root.mkdir(parents=True)
        (root / "big.bin").write_text("old\n")
    seconds = _interrupt_midway(cluster, roots, src, f"{parent}/big.bin", signum)
    print(f"temp names gone {seconds:.2f}s after {signal.Signals(signum).name}")
    for host, root in roots.items():
        assert (root / "big.bin").read_text() == "old\n", host
