"""Setup-script delivery and the in-container sshd.

Pure builders are tested table-driven / with hypothesis; everything that
crosses SSH or touches a container runs against the real sandbox (OpenSSH
sshd + dockerd per network namespace). Containers are started here with the
docker CLI over the same SSHPool the orchestrator uses, and removed after.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator import remote
from orchestrator.config import ClusterConfig, ContainerConfig, HostSpec, load_cluster, sshd_wanted
from orchestrator.containers import mpi
from orchestrator.containers.provision import (
    EXIT_BAD_PAYLOAD,
    EXIT_CHECKSUM,
    EXIT_MISSING_TOOL,
    EXIT_NO_SSHD,
    MARKER_PATH,
    SSHD_FILES,
    SetupScript,
    ensure_sshd,
    ensure_sshd_argv,
    frame_files,
    run_setup_script,
    setup_argv,
    setup_payload,
    sshd_files,
)
from orchestrator.results import HostResult
from orchestrator.sandbox import BASE_TAG, SSHD_TAG, Sandbox
from orchestrator.ssh.keys import ClusterKeys
from orchestrator.ssh.transport import SSHPool

# Not 2224: other test modules may run their own in-container sshd on the
# same sandbox hosts in the same session.
PORT = 2391
DOCKER = ["docker"]  # the sandbox login user is in the docker group

DEFAULT_SCRIPT = Path(__file__).resolve().parents[1] / "setup_scripts" / "default.sh"


class SSHDReport(NamedTuple):
    pid: int | None
    started: bool  # False: it was already running


def sshd_report(stdout: str) -> SSHDReport:
    """`sshd-pid N` and whether ensure_sshd's stdout says `sshd: started`."""
    pid = re.search(r"^sshd-pid (\d+)$", stdout, re.MULTILINE)
    return SSHDReport(int(pid.group(1)) if pid else None, "sshd: started" in stdout.splitlines())


def _cluster(hosts: list[HostSpec], **container: object) -> ClusterConfig:
    cfg = ContainerConfig(image="cvs-sandbox:sshd", **container)  # type: ignore[arg-type]
    return ClusterConfig(name="prov", hosts=hosts, container=cfg)


# --- pure: sshd_wanted, builders -------------------------------------------


@pytest.mark.parametrize(
    ("enabled", "n_hosts", "wanted"),
    [
        ("auto", 1, False),
        ("auto", 2, True),
        ("auto", 5, True),
        (True, 1, True),
        (True, 3, True),
        (False, 1, False),
        (False, 3, False),
    ],
)
def test_sshd_wanted_follows_enabled_and_host_count(
    enabled: object, n_hosts: int, wanted: bool
) -> None:
    hosts = [HostSpec(name=f"n{i}") for i in range(n_hosts)]
    cluster = _cluster(hosts, sshd={"enabled": enabled})
    assert sshd_wanted(cluster.container, len(cluster.hosts)) is wanted


def test_sshd_wanted_without_container_block_is_auto() -> None:
    one = ClusterConfig(hosts=[HostSpec(name="a")])
    two = ClusterConfig(hosts=[HostSpec(name="a"), HostSpec(name="b")])
    assert (sshd_wanted(one.container, 1), sshd_wanted(two.container, 2)) == (False, True)


def test_hostfile_has_one_line_per_host_with_slots_in_cluster_order() -> None:
    cluster = _cluster([HostSpec(name="gpu2"), HostSpec(name="gpu1")])
    assert mpi.hostfile_text(cluster, 8) == "gpu2 slots=8\ngpu1 slots=8\n"


@pytest.fixture(scope="module")
def three_keys(tmp_path_factory: pytest.TempPathFactory) -> ClusterKeys:
    return ClusterKeys.load_or_create(tmp_path_factory.mktemp("keys"), ["a", "b", "c"])


def _abc() -> list[HostSpec]:
    return [
        HostSpec(name="a", address="10.0.0.1", vpc_address="192.168.0.1"),
        HostSpec(name="b", address="10.0.0.2"),
        HostSpec(name="c"),
    ]


def test_known_hosts_names_each_peer_by_name_and_addresses_with_its_port(
    three_keys: ClusterKeys,
) -> None:
    text = mpi.known_hosts_text(_cluster(_abc()), three_keys, 2224)
    lines = text.splitlines()
    assert lines[0] == (
        f"[a]:2224,[192.168.0.1]:2224,[10.0.0.1]:2224 {three_keys.host_key('a').public_blob}"
    )
    assert lines[1].startswith("[b]:2224,[10.0.0.2]:2224 ssh-ed25519 ")
    assert lines[2].startswith("[c]:2224 ssh-ed25519 ")
    assert len({line.split()[2] for line in lines}) == 3  # a distinct host key each


def test_known_hosts_uses_bare_names_on_port_22(three_keys: ClusterKeys) -> None:
    text = mpi.known_hosts_text(_cluster(_abc()), three_keys, 22)
    assert text.splitlines()[1].startswith("b,10.0.0.2 ssh-ed25519 ")


def test_ssh_config_maps_names_and_addresses_to_the_inter_host_address() -> None:
    text = mpi.ssh_config_text(_cluster(_abc()), 2224, "~/.ssh/k")
    blocks = text.split("\n\n")
    assert blocks[0].splitlines()[1:3] == [
        "Host a 192.168.0.1 10.0.0.1",
        "    HostName 192.168.0.1",
    ]
    assert "Host b 10.0.0.2\n    HostName 10.0.0.2\n    Port 2224\n    IdentityFile " in text
    assert "Host c\n    HostName c\n" in text
    for needle in ("IdentityFile ~/.ssh/k", "StrictHostKeyChecking yes", "BatchMode yes"):
        assert text.count(needle) == 3
    assert text.count(f"UserKnownHostsFile {mpi.KNOWN_HOSTS_PATH}") == 3


def test_sshd_config_is_key_only_ed25519_with_pidfile() -> None:
    lines = mpi.sshd_config_text(2391).splitlines()
    for line in (
        "Port 2391",
        f"HostKey {mpi.HOST_KEY_PATH}",
        f"PidFile {mpi.SSHD_PID_FILE}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "UsePAM no",
    ):
        assert line in lines
    assert [ln for ln in lines if ln.startswith("HostKey")] == [f"HostKey {mpi.HOST_KEY_PATH}"]


def test_sshd_files_carry_this_hosts_key_only(three_keys: ClusterKeys) -> None:
    files = sshd_files(_cluster(_abc()), three_keys, "b")
    assert tuple(files) == SSHD_FILES
    assert files["host_key"] == three_keys.host_key("b").private
    assert three_keys.host_key("a").private not in "".join(files.values())
    assert files["authorized_keys"] == three_keys.user.public + "\n"


def _unframe(payload: str) -> dict[str, str]:
    """The framing as the in-container program reads it, in Python."""
    out: dict[str, str] = {}
    current: str | None = None
    body: list[str] = []
    lines = payload.split("\n")
    assert lines[-2:] == ["@@cvs-done", ""]
    for line in lines[:-2]:
        if line.startswith("@@cvs-file "):
            current, body = line.removeprefix("@@cvs-file "), []
        elif line == "@@cvs-end":
            assert current is not None
            out[current] = base64.b64decode("".join(body)).decode()
            current = None
        else:
            assert re.fullmatch(r"[A-Za-z0-9+/=]*", line), line  # never a frame line
            body.append(line)
    return out


@given(st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), st.text(), max_size=5))
def test_framed_files_round_trip_whatever_their_content(files: dict[str, str]) -> None:
    assert _unframe(frame_files(files)) == files


def test_frame_names_outside_the_fixed_alphabet_are_refused() -> None:
    with pytest.raises(ValueError):
        frame_files({"../x": "y"})


def test_setup_argv_carries_only_the_fixed_decoder_and_the_digest() -> None:
    script = SetupScript.from_bytes(b"echo secret-payload\n")
    argv = setup_argv(DOCKER, "box", script.sha256)
    assert argv[:6] == ["docker", "exec", "-i", "-u", "0", "box"]
    assert argv[6:] == remote.argv("setup", script.sha256, MARKER_PATH)
    assert "secret-payload" not in " ".join(argv)


@pytest.mark.parametrize("bad", ["", "abc", "Z" * 64, "0" * 63, "0" * 64 + ";rm"])
def test_setup_argv_refuses_a_non_digest(bad: str) -> None:
    with pytest.raises(ValueError):
        setup_argv(DOCKER, "box", bad)


@pytest.mark.parametrize("port", [0, 65536])
def test_ensure_sshd_argv_refuses_bad_ports(port: int) -> None:
    with pytest.raises(ValueError):
        ensure_sshd_argv(DOCKER, "box", port, "/etc/cvs/hostfile")


def test_ensure_sshd_argv_passes_port_paths_and_login_as_arguments() -> None:
    # remote/sshd.sh takes them as arguments (it computes the /proc/net hex
    # itself: tests/test_remote.py pins that under every host shell).
    argv = ensure_sshd_argv(DOCKER, "box", 2224, "/etc/cvs/hostfile", address="10.0.0.2")
    assert argv[-9:-6] == ["2224", "/etc/cvs/hostfile", mpi.SSHD_PID_FILE]
    assert argv[-2:] == ["", "10.0.0.2"]  # login (the image's USER), inter-host address
    assert argv[3:5] == ["-u", "0"]


def test_no_setup_script_means_the_packaged_default() -> None:
    for value in (None, "", "  "):
        script = SetupScript.for_config(ContainerConfig(image="x", setup_script=value))
        assert script.is_default
        assert script.content == DEFAULT_SCRIPT.read_bytes()
        assert script.sha256 == hashlib.sha256(script.content).hexdigest()


def test_a_configured_setup_script_is_read_from_its_path(tmp_path: Path) -> None:
    path = tmp_path / "s.sh"
    path.write_bytes(b"echo mine\n")
    script = SetupScript.for_config(ContainerConfig(image="x", setup_script=str(path)))
    assert (script.is_default, script.path, script.content) == (False, str(path), b"echo mine\n")


def test_default_script_is_strict_bash_and_parses() -> None:
    text = DEFAULT_SCRIPT.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in text
    for manager in ("apt-get", "dnf", "yum", "zypper", "apk"):
        assert manager in text
    subprocess.run(["bash", "-n", str(DEFAULT_SCRIPT)], check=True)


def test_setup_payload_is_base64_of_the_script() -> None:
    content = os.urandom(5000)
    assert base64.b64decode(setup_payload(content)) == content


# --- real sandbox ------------------------------------------------------------


def _run(coro_fn, *args):  # type: ignore[no-untyped-def]
    return anyio.run(coro_fn, *args)


class Boxes:
    """Containers this module started on sandbox hosts, by host."""

    def __init__(self, sandbox: Sandbox, n_hosts: int, tmp: Path) -> None:
        loaded = load_cluster(sandbox.cluster_file)
        hosts = loaded.hosts[:n_hosts]
        container = ContainerConfig(
            image=SSHD_TAG,
            name=f"prov-{uuid.uuid4().hex[:8]}",
            sshd={"port": PORT},
            mpi={"slots": 2, "hostfile": "/etc/cvs/hostfile"},
        )
        self.cluster = loaded.model_copy(
            update={"hosts": hosts, "container": container, "state_dir": str(tmp / "state")}
        )
        self.name = container.name
        self.hosts = [h.name for h in hosts]
        self.keys = ClusterKeys.load_or_create(tmp / "state", self.hosts)
        self.extra: list[tuple[str, str]] = []  # (host, name) of throwaway containers

    def pool(self) -> SSHPool:
        return SSHPool(self.cluster)

    async def start(self, pool: SSHPool, host: str, name: str, image: str) -> None:
        await pool.run(host, [*DOCKER, "rm", "-f", name])
        r = await pool.run(
            host, [*DOCKER, "run", "-d", "--name", name, "--network", "host", image, "sleep", "inf"]
        )
        assert r.ok, r
        # Each container learns who it is, so an ssh hop shows where it landed.
        r = await pool.run(host, [*DOCKER, "exec", name, "sh", "-c", f"echo {host} > /cvs-whoami"])
        assert r.ok, r

    async def start_all(self) -> None:
        async with self.pool() as pool, anyio.create_task_group() as tg:
            for host in self.hosts:
                tg.start_soon(self.start, pool, host, self.name, SSHD_TAG)

    async def throwaway(self, host: str, image: str) -> str:
        name = f"prov-tmp-{uuid.uuid4().hex[:8]}"
        self.extra.append((host, name))
        async with self.pool() as pool:
            await self.start(pool, host, name, image)
        return name

    async def remove_all(self) -> None:
        async with self.pool() as pool:
            for host in self.hosts:
                await pool.run(host, [*DOCKER, "rm", "-f", self.name])
            for host, name in self.extra:
                await pool.run(host, [*DOCKER, "rm", "-f", name])

    async def exec(self, host: str, argv: list[str], name: str | None = None) -> HostResult:
        async with self.pool() as pool:
            return await pool.run(host, [*DOCKER, "exec", name or self.name, *argv])


@pytest.fixture(scope="module")
def boxes(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boxes]:
    b = Boxes(sandbox, 3, tmp_path_factory.mktemp("prov"))
    try:
        _run(b.start_all)
        yield b
    finally:
        _run(b.remove_all)


async def _setup(b: Boxes, host: str, script: SetupScript, name: str | None = None, **kw: object):  # type: ignore[no-untyped-def]
    async with b.pool() as pool:
        return await run_setup_script(pool, host, DOCKER, name or b.name, script, **kw)  # type: ignore[arg-type]


async def _sshd(b: Boxes, host: str, name: str | None = None) -> HostResult:
    async with b.pool() as pool:
        return await ensure_sshd(pool, host, DOCKER, name or b.name, b.cluster, b.keys)


async def _sshd_all(b: Boxes) -> dict[str, HostResult]:
    out: dict[str, HostResult] = {}
    async with b.pool() as pool:

        async def one(host: str) -> None:
            out[host] = await ensure_sshd(pool, host, DOCKER, b.name, b.cluster, b.keys)

        async with anyio.create_task_group() as tg:
            for host in b.hosts:
                tg.start_soon(one, host)
    return out


def _marker(b: Boxes, host: str, name: str | None = None) -> str | None:
    r = _run(b.exec, host, ["cat", MARKER_PATH], name)
    return r.stdout.strip() if r.ok else None


def test_a_1_mib_setup_script_runs_and_the_marker_holds_its_sha(boxes: Boxes) -> None:
    filler = b"# " + b"x" * 1021 + b"\n"
    content = b"echo begin\n" + filler * 1024 + b"echo end-of-big-script\n"
    assert len(content) > 1024 * 1024
    script = SetupScript.from_bytes(content)
    result = _run(_setup, boxes, "node1", script)
    assert result.ok, result.tail()
    assert "begin" in result.stdout and "end-of-big-script" in result.stdout
    assert _marker(boxes, "node1") == script.sha256


def test_a_failing_middle_pipe_stage_fails_the_host_and_leaves_no_marker(boxes: Boxes) -> None:
    ok = SetupScript.from_bytes(b"echo fine\n")
    assert _run(_setup, boxes, "node2", ok).ok
    assert _marker(boxes, "node2") == ok.sha256
    # No `set -e`, last stage succeeds: only pipefail makes this fail.
    bad = SetupScript.from_bytes(b"echo step-one\ntrue | false | cat\n")
    result = _run(_setup, boxes, "node2", bad)
    assert result.status == "failed" and result.exit_code == 1
    assert "step-one" in result.tail()
    assert "setup script failed" in result.stderr
    assert _marker(boxes, "node2") is None  # the next `up` provisions again


def test_a_corrupted_payload_is_refused_and_leaves_no_marker(boxes: Boxes) -> None:
    good = SetupScript.from_bytes(b"touch /tmp/should-not-run\n")
    tampered = setup_payload(b"touch /tmp/should-not-run; echo evil\n")

    async def send() -> HostResult:
        async with boxes.pool() as pool:
            await pool.run(
                "node3", [*DOCKER, "exec", boxes.name, "sh", "-c", f"echo x > {MARKER_PATH}"]
            )
            argv = setup_argv(DOCKER, boxes.name, good.sha256)
            return await pool.run("node3", argv, input=tampered)

    result = _run(send)
    assert result.exit_code == EXIT_CHECKSUM
    assert "checksum mismatch" in result.stderr and "refusing" in result.stderr
    assert _marker(boxes, "node3") is None
    assert not _run(boxes.exec, "node3", ["test", "-e", "/tmp/should-not-run"]).ok


def test_an_undecodable_payload_is_refused(boxes: Boxes) -> None:
    sha = hashlib.sha256(b"").hexdigest()

    async def send() -> HostResult:
        async with boxes.pool() as pool:
            return await pool.run("node3", setup_argv(DOCKER, boxes.name, sha), input="@@@\n")

    result = _run(send)
    assert result.exit_code == EXIT_BAD_PAYLOAD and "decode" in result.stderr


def test_an_image_without_base64_gets_an_error_naming_it(boxes: Boxes) -> None:
    name = _run(boxes.throwaway, "node1", BASE_TAG)
    assert _run(boxes.exec, "node1", ["rm", "/usr/bin/base64"], name).ok
    result = _run(_setup, boxes, "node1", SetupScript.from_bytes(b"true\n"), name)
    assert result.exit_code == EXIT_MISSING_TOOL
    assert "lacks: base64" in result.stderr and "sha256sum" not in result.stderr


def test_a_setup_script_timeout_stops_it_inside_the_container(boxes: Boxes) -> None:
    script = SetupScript.from_bytes(b"sleep 137\n")
    result = _run(functools.partial(_setup, boxes, "node1", script, timeout=2))
    assert result.status == "timeout"
    left = _run(boxes.exec, "node1", ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
    assert "sleep 137" not in left.stdout
    assert _marker(boxes, "node1") is None


def test_the_default_script_exits_early_when_sshd_is_installed(boxes: Boxes) -> None:
    result = _run(_setup, boxes, "node3", SetupScript.default())
    assert result.ok, result.tail()
    assert "already installed" in result.stdout
    assert _marker(boxes, "node3") == SetupScript.default().sha256


def test_ensure_sshd_without_sshd_in_the_image_says_what_to_do(boxes: Boxes) -> None:
    name = _run(boxes.throwaway, "node2", BASE_TAG)
    result = _run(_sshd, boxes, "node2", name)
    assert result.exit_code == EXIT_NO_SSHD
    assert "image has no sshd" in result.stderr and "default setup script" in result.stderr


def _ssh_peer(b: Boxes, src: str, dst: str) -> HostResult:
    # The container's ~/.ssh/config carries strict checking; repeat it here so
    # the test does not depend on that file alone.
    argv = ["ssh", "-o", "StrictHostKeyChecking=yes", dst, "hostname && cat /cvs-whoami"]
    return _run(b.exec, src, argv)


def test_every_container_reaches_every_peer_by_name_with_strict_host_keys(boxes: Boxes) -> None:
    results = _run(_sshd_all, boxes)
    for host, r in results.items():
        assert r.ok, (host, r.tail())
        assert sshd_report(r.stdout).pid
    for src in boxes.hosts:
        for dst in boxes.hosts:
            r = _ssh_peer(boxes, src, dst)
            assert r.ok, (src, dst, r.tail())
            assert r.stdout.splitlines()[-1] == dst
    hostfile = _run(boxes.exec, "node1", ["cat", "/etc/cvs/hostfile"]).stdout
    assert hostfile.splitlines() == [f"{h} slots=2" for h in boxes.hosts]


def test_ensure_sshd_again_leaves_the_running_sshd_alone(boxes: Boxes) -> None:
    first = {h: sshd_report(r.stdout) for h, r in _run(_sshd_all, boxes).items()}
    second = {h: sshd_report(r.stdout) for h, r in _run(_sshd_all, boxes).items()}
    for host in boxes.hosts:
        assert second[host].pid == first[host].pid
        assert not second[host].started


def test_a_killed_sshd_is_restarted_on_that_host_only(boxes: Boxes) -> None:
    before = {h: sshd_report(r.stdout) for h, r in _run(_sshd_all, boxes).items()}
    pid = before["node2"].pid
    assert _run(boxes.exec, "node2", ["kill", str(pid)]).ok
    # The reparented sshd may linger as a zombie: the listen probe sees it gone.
    after = {h: sshd_report(r.stdout) for h, r in _run(_sshd_all, boxes).items()}
    assert after["node2"].started and after["node2"].pid != pid
    for host in ("node1", "node3"):
        assert not after[host].started and after[host].pid == before[host].pid
    assert _ssh_peer(boxes, "node1", "node2").ok


def _key_body_lines(text: str) -> list[str]:
    """Base64 lines that only a copy of this private key contains.

    The first body line is the same in every OpenSSH ed25519 key (format
    header), so it is left out.
    """
    body = [ln for ln in text.splitlines() if ln and "PRIVATE KEY" not in ln]
    return body[1:]


def _private_keys_on_the_login_side(sandbox: Sandbox) -> dict[str, list[str]]:
    """Private key files of the login user (host) and of the local user/sandbox client."""
    candidates = [sandbox.key_file]
    for home in (Path("/home/cvs"), Path.home()):
        ssh_dir = home / ".ssh"
        if ssh_dir.is_dir():
            candidates += [p for p in ssh_dir.iterdir() if p.is_file()]
    keys = {}
    for path in candidates:
        text = path.read_text(errors="replace")
        if "PRIVATE KEY" in text:
            keys[str(path)] = _key_body_lines(text)
    return keys


def _files_containing(b: Boxes, host: str, needles: list[str]) -> HostResult:
    patterns = [arg for n in needles for arg in ("-e", n)]
    argv = ["grep", "-rlF", *patterns, "/", "--exclude-dir=proc", "--exclude-dir=sys",
            "--exclude-dir=dev"]  # fmt: skip
    return _run(b.exec, host, argv)


@contextlib.contextmanager
def _decoy_key_in_login_home() -> Iterator[Path]:
    """A private key in the login user's ~/.ssh for the duration (removed after)."""
    ssh_dir = Path("/home/cvs/.ssh")
    made_dir = not ssh_dir.exists()
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    decoy = ssh_dir / f"id_ed25519_provtest_{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(decoy)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield decoy
    finally:
        decoy.unlink(missing_ok=True)
        decoy.with_suffix(".pub").unlink(missing_ok=True)
        if made_dir:
            with contextlib.suppress(OSError):
                ssh_dir.rmdir()


def test_no_private_key_of_the_login_user_enters_any_container(
    boxes: Boxes, sandbox: Sandbox
) -> None:
    with _decoy_key_in_login_home():
        assert all(r.ok for r in _run(_sshd_all, boxes).values())
        _run(_setup, boxes, "node1", SetupScript.default())
        secrets = _private_keys_on_the_login_side(sandbox)
        assert str(sandbox.key_file) in secrets and len(secrets) >= 2
        needles = [line for lines in secrets.values() for line in lines]
        for host in boxes.hosts:
            leaked = _files_containing(boxes, host, needles)
            assert leaked.exit_code == 1 and not leaked.stdout, (host, leaked.stdout)
            # Positive control: the same search finds the cluster key we did install.
            ours = _files_containing(boxes, host, _key_body_lines(boxes.keys.user.private))
            assert ours.ok and mpi.USER_KEY_NAME in ours.stdout, (host, ours.tail())


# --- the default script for real (apt against Debian's mirrors) ----------------


def test_default_script_installs_sshd_in_a_bare_image_and_it_listens(
    egress_sandbox: Sandbox, tmp_path: Path
) -> None:
    assert egress_sandbox.egress_cluster_file is not None
    loaded = load_cluster(egress_sandbox.egress_cluster_file)
    # The egress host shares the machine's network namespace: use a port
    # nothing else here is likely to hold.
    port = 20000 + os.getpid() % 20000
    container = ContainerConfig(
        image=BASE_TAG, name=f"prov-apt-{uuid.uuid4().hex[:8]}", sshd={"port": port}
    )
    cluster = loaded.model_copy(update={"container": container})
    host = cluster.hosts[0].name
    keys = ClusterKeys.load_or_create(tmp_path / "state", [host])
    name = container.name
    assert name is not None

    async def scenario() -> tuple[HostResult, HostResult, HostResult, HostResult]:
        async with SSHPool(cluster) as pool:
            run = [*DOCKER, "run", "-d", "--name", name, "--network", "host", BASE_TAG]
            started = await pool.run(host, [*run, "sleep", "infinity"])
            assert started.ok, started
            try:
                setup = await run_setup_script(
                    pool, host, DOCKER, name, SetupScript.default(), timeout=540
                )
                sshd = await ensure_sshd(pool, host, DOCKER, name, cluster, keys)
                # ssh from the container to itself: sshd answers with the cluster key.
                hop = await pool.run(
                    host,
                    [*DOCKER, "exec", name, "ssh", host, "test -x /usr/sbin/sshd && echo via-ssh"],
                )
                marker = await pool.run(host, [*DOCKER, "exec", name, "cat", MARKER_PATH])
            finally:
                await pool.run(host, [*DOCKER, "rm", "-f", name])
            return setup, sshd, hop, marker

    setup, sshd, hop, marker = _run(scenario)
    assert setup.ok, setup.tail(40)
    assert "installing openssh-server with apt-get" in setup.stdout
    assert marker.stdout.strip() == SetupScript.default().sha256
    assert sshd.ok and sshd_report(sshd.stdout).started, sshd.tail()
    assert hop.ok and hop.stdout.strip().endswith("via-ssh"), hop.tail()
