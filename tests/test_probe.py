"""The one-round-trip probe: the script run for real with `sh -c` against a
private dockerd (DOCKER_HOST), and the parser on hand-made output."""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from private_dockerd import TEST_IMAGE, PrivateDockerd

from orchestrator import remote
from orchestrator.config import ContainerConfig
from orchestrator.containers.argv import run_argv
from orchestrator.containers.labels import managed_labels
from orchestrator.containers.probe import (
    HostState,
    inspect_image_arg,
    parse_probe_output,
    probe_argv,
)
from orchestrator.remote.frames import parse_sections
from orchestrator.remote.records import forget_argv, provisioned_argv

MARKER = "/etc/cvs/provisioned"
SHA = "ab" * 32
PORT = 2224


@pytest.fixture
def cfg() -> ContainerConfig:
    # No host networking: each container gets its own loopback, so whatever
    # listens on the host's ports cannot leak into the sshd check.
    return ContainerConfig(image=TEST_IMAGE, name="probed", network="none", ipc=None)


def run_probe(
    env: dict[str, str],
    cfg: ContainerConfig | None,
    name: str = "probed",
    *,
    shell: tuple[str, ...] = ("/bin/sh",),
    **kw: str,
) -> HostState:
    argv = probe_argv(cfg, name, sshd_port=PORT, marker_path=kw.get("marker", MARKER))
    # The host's records go to this test's state directory (state_home).
    env = {**env, "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}
    out = subprocess.run([*shell, *argv[1:]], env=env, capture_output=True, text=True, timeout=60)
    return parse_probe_output("h1", out.returncode, out.stdout, out.stderr)


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the probe reads (and the fallback writes) the host's records."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@pytest.fixture
def container(dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig):
    dockerd.run_argv(run_argv(["docker"], cfg, "probed", managed_labels("alpha", "cfg1")))
    yield "probed"
    dockerd.run_argv(["docker", "rm", "-f", "probed"], check=False)


def fake_bin(tmp_path: Path, scripts: dict[str, str], links: tuple[str, ...] = ()) -> str:
    """A PATH of stand-in commands plus symlinks to a few real ones."""
    d = tmp_path / "bin"
    d.mkdir()
    for name, body in scripts.items():
        (d / name).write_text("#!/bin/sh\n" + body)
        (d / name).chmod(0o755)
    for name in links:
        real = shutil.which(name)
        assert real, name
        (d / name).symlink_to(real)
    return str(d)


BASICS = ("mktemp", "rm", "base64", "od", "cat", "grep")

# --- real dockerd ----------------------------------------------------------

pytestmark_real = pytest.mark.sandbox


@pytestmark_real
def test_no_container_is_absent_and_tag_resolves(
    dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig
) -> None:
    state = run_probe(dockerd.env, cfg)
    assert state.known and state.error is None
    assert state.access == "direct"
    assert state.container == "absent"
    assert state.tag_image_id == image_id
    assert state.sshd_listening is None and state.provision_marker is None


@pytestmark_real
def test_running_container_reports_identity_labels_listener_and_marker(
    dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig, container: str
) -> None:
    dockerd.docker("exec", container, "sh", "-c", f"mkdir -p /etc/cvs && echo {SHA} > {MARKER}")
    dockerd.docker("exec", "-d", container, "httpd", "-f", "-p", f"127.0.0.1:{PORT}")
    inspect = dockerd.docker("inspect", "--format", "{{.Id}} {{.State.StartedAt}}", container)
    cid, started = inspect.stdout.split()
    for _ in range(50):  # httpd -d returns before the socket is bound
        state = run_probe(dockerd.env, cfg)
        if state.sshd_listening:
            break
    assert state.known
    assert state.container == "running"
    assert state.container_id == cid
    assert state.started_at == started
    assert state.container_image_id == image_id == state.tag_image_id
    assert state.container_image_readable
    assert dict(state.labels) == managed_labels("alpha", "cfg1")
    assert state.host_config is not None and state.host_config.shm_size == 64 * 2**20
    assert state.sshd_listening is True
    assert state.provision_marker == SHA


@pytestmark_real
def test_running_container_without_listener_or_marker(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str
) -> None:
    state = run_probe(dockerd.env, cfg)
    assert state.container == "running"
    assert state.sshd_listening is False
    assert state.provision_marker is None
    assert state.exec_error is None


@pytestmark_real
def test_exited_container_still_reports_its_marker(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str
) -> None:
    dockerd.docker("exec", container, "sh", "-c", f"mkdir -p /etc/cvs && echo {SHA} > {MARKER}")
    dockerd.docker("stop", "-t", "0", container)
    state = run_probe(dockerd.env, cfg)
    assert state.known
    assert state.container == "exited"
    assert state.container_status == "exited"
    assert state.sshd_listening is None
    assert state.provision_marker == SHA


@pytestmark_real
def test_marker_path_with_spaces_and_quotes_is_read_verbatim(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str
) -> None:
    odd = "/tmp/it's a $(marker)"
    dockerd.docker("exec", container, "sh", "-c", 'echo done > "$1"', "sh", odd)
    assert run_probe(dockerd.env, cfg, marker=odd).provision_marker == "done"


@pytestmark_real
def test_missing_tag_reads_as_no_image(
    dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig
) -> None:
    other = cfg.model_copy(update={"image": "cvs-test/not-here:9"})
    state = run_probe(dockerd.env, other)
    assert state.known
    assert state.tag_image_id is None and state.tag_error is None


@pytestmark_real
def test_daemon_down_is_unknown_never_absent(tmp_path: Path, cfg: ContainerConfig) -> None:
    if not shutil.which("docker"):
        pytest.skip("no docker CLI")
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/gone.sock"}
    # A sudo that cannot elevate keeps this about the daemon, not about sudo.
    env["PATH"] = fake_bin(tmp_path, {"sudo": "echo 'sudo: a password is required' >&2\nexit 1"})
    env["PATH"] += ":" + os.environ["PATH"]
    state = run_probe(env, cfg)
    assert not state.known
    assert state.container is None
    assert state.error_kind == "daemon_down"
    assert "daemon" in (state.error or "")


@pytestmark_real
def test_sudo_is_used_when_plain_docker_is_denied(
    dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig, tmp_path: Path
) -> None:
    real_docker = shutil.which("docker")
    denied = (
        "echo 'permission denied while trying to connect to the Docker daemon socket "
        "at unix:///var/run/docker.sock' >&2\nexit 1"
    )
    sudo = f'[ "$1" = -n ] && [ "$2" = docker ] || exit 1\nshift 2\nexec {real_docker} "$@"'
    env = {**dockerd.env, "PATH": fake_bin(tmp_path, {"docker": denied, "sudo": sudo}, BASICS)}
    state = run_probe(env, cfg)
    assert state.access == "sudo"
    assert state.known and state.container == "absent"
    assert state.tag_image_id == image_id


@pytestmark_real
def test_no_access_to_docker_is_a_clear_error(
    dockerd: PrivateDockerd, cfg: ContainerConfig, tmp_path: Path
) -> None:
    denied = "echo 'permission denied while trying to connect to the Docker daemon socket' >&2\n"
    scripts = {
        "docker": denied + "exit 1",
        "sudo": "echo 'sudo: a password is required' >&2\nexit 1",
    }
    env = {**dockerd.env, "PATH": fake_bin(tmp_path, scripts, BASICS)}
    state = run_probe(env, cfg)
    assert state.access == "none"
    assert state.error_kind == "no_access"
    assert not state.known and state.container is None
    assert "docker group" in (state.error or "")


@pytestmark_real
def test_docker_not_installed_is_named(cfg: ContainerConfig, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": fake_bin(tmp_path, {}, BASICS)}
    state = run_probe(env, cfg)
    assert state.access == "none"
    assert state.error_kind == "no_runtime"


@pytestmark_real
def test_hosts_without_base64_fall_back_to_hex(
    dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig, container: str, tmp_path: Path
) -> None:
    env = {**dockerd.env, "PATH": fake_bin(tmp_path, {}, ("mktemp", "rm", "od", "docker", "grep"))}
    state = run_probe(env, cfg)
    assert state.container == "running"
    assert state.tag_image_id == image_id
    assert state.sshd_listening is False


@pytestmark_real
def test_remote_command_form_runs_under_any_login_shell(
    dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig
) -> None:
    cmd = shlex.join(probe_argv(cfg, "probed", sshd_port=PORT, marker_path=MARKER))
    out = subprocess.run(
        ["bash", "-c", cmd], env=dockerd.env, capture_output=True, text=True, timeout=60
    )
    assert parse_probe_output("h1", out.returncode, out.stdout, out.stderr).container == "absent"


def counting_docker(
    tmp_path: Path, env: dict[str, str], *, inspect_sed: str | None = None
) -> tuple[dict[str, str], Path]:
    """env whose `docker` logs each call's subcommand to the returned file
    (and passes what `docker inspect` prints through `sed inspect_sed`)."""
    log = tmp_path / "docker.log"
    real = shutil.which("docker")
    body = f'echo "$1" >> {log}\n'
    if inspect_sed is not None:
        body += (
            f'if [ "$1" = inspect ]; then {real} "$@" | sed {shlex.quote(inspect_sed)}; exit; fi\n'
        )
    path = fake_bin(tmp_path, {"docker": body + f'exec {real} "$@"\n'}, ())
    return {**env, "PATH": f"{path}:{env.get('PATH', os.defpath)}"}, log


def calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def record(state_home: Path, cid: str, sha: str = SHA) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    subprocess.run(provisioned_argv(cid, sha), env=env, check=True)


def container_id(dockerd: PrivateDockerd, name: str) -> str:
    return dockerd.docker("inspect", "--format", "{{.Id}}", name).stdout.strip()


@pytestmark_real
def test_attach_probe_learns_marker_and_listener_from_the_host_with_one_docker_process(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str, tmp_path: Path, state_home: Path
) -> None:
    # Provisioned by cvs (the record), no marker inside: the record is what is read.
    record(state_home, container_id(dockerd, container))
    dockerd.docker("exec", "-d", container, "httpd", "-f", "-p", f"127.0.0.1:{PORT}")
    env, log = counting_docker(tmp_path, dockerd.env)
    for _ in range(50):  # httpd -d returns before the socket is bound
        log.unlink(missing_ok=True)
        state = run_probe(env, cfg)
        if state.sshd_listening:
            break
    assert state.container == "running"
    assert state.provision_marker == SHA
    assert state.sshd_listening is True
    assert calls(log) == ["inspect"]


# The /bin/sh a host may have: dash (Debian, Ubuntu), bash (RHEL, SLES), busybox.
HOST_SHELLS = {
    "dash": ("dash",),
    "bash": ("bash", "--posix"),
    "busybox": ("busybox", "sh"),
}


@pytestmark_real
@pytest.mark.parametrize("shell", sorted(HOST_SHELLS))
def test_the_attach_probe_reads_the_same_under_every_host_shell(
    dockerd: PrivateDockerd,
    cfg: ContainerConfig,
    container: str,
    tmp_path: Path,
    state_home: Path,
    shell: str,
) -> None:
    argv = HOST_SHELLS[shell]
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed here")
    record(state_home, container_id(dockerd, container))
    dockerd.docker("exec", "-d", container, "httpd", "-f", "-p", f"127.0.0.1:{PORT}")
    env, log = counting_docker(tmp_path, dockerd.env)
    for _ in range(50):  # httpd -d returns before the socket is bound
        log.unlink(missing_ok=True)
        state = run_probe(env, cfg, shell=argv)
        if state.sshd_listening:
            break
    assert state.known and state.container == "running", state
    assert state.container_id == container_id(dockerd, container)
    assert state.provision_marker == SHA
    assert state.sshd_listening is True
    assert calls(log) == ["inspect"]


@pytestmark_real
def test_a_record_for_another_container_vouches_for_nothing(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str, state_home: Path
) -> None:
    record(state_home, "f" * 64)
    state = run_probe(dockerd.env, cfg)
    assert state.container == "running"
    assert state.provision_marker is None


@pytestmark_real
def test_marker_found_inside_is_recorded_so_the_next_probe_stays_outside(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str, tmp_path: Path, state_home: Path
) -> None:
    dockerd.docker("exec", container, "sh", "-c", f"mkdir -p /etc/cvs && echo {SHA} > {MARKER}")
    env, log = counting_docker(tmp_path, dockerd.env)
    first = run_probe(env, cfg)
    assert first.provision_marker == SHA and calls(log) == ["inspect", "exec"]
    cid = container_id(dockerd, container)
    assert (state_home / "cvs" / "provisioned" / cid).read_text() == SHA + "\n"
    assert (state_home / "cvs" / "provisioned").stat().st_mode & 0o077 == 0
    log.unlink()
    second = run_probe(env, cfg)
    assert second.provision_marker == SHA and second.sshd_listening is False
    assert calls(log) == ["inspect"]


@pytestmark_real
def test_stopped_container_with_a_record_needs_no_cp_from_it(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str, tmp_path: Path, state_home: Path
) -> None:
    record(state_home, container_id(dockerd, container))
    dockerd.docker("stop", "-t", "0", container)
    env, log = counting_docker(tmp_path, dockerd.env)
    state = run_probe(env, cfg)
    assert state.container == "exited" and state.provision_marker == SHA
    assert calls(log) == ["inspect"]


# docker says PID 1: in the facts line and in the object's JSON.
PID_ONE = r's/^F \([0-9a-f]*\) [0-9]* /F \1 1 /;s/"Pid":[0-9]*,/"Pid":1,/'


@pytestmark_real
def test_a_pid_that_is_not_the_containers_is_not_trusted_for_the_listener(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str, tmp_path: Path, state_home: Path
) -> None:
    # A login in another PID namespace than dockerd's sees some other process
    # under docker's PID: here docker says PID 1, the host's init, whose socket
    # table is not the container's. The check inside the container answers.
    record(state_home, container_id(dockerd, container))
    env, log = counting_docker(tmp_path, dockerd.env, inspect_sed=PID_ONE)
    state = run_probe(env, cfg)
    assert state.container == "running" and state.provision_marker == SHA
    assert state.sshd_listening is False
    assert calls(log) == ["inspect", "exec"]


@pytestmark_real
def test_sshd_listening_on_ipv6_alone_is_not_listening(
    dockerd: PrivateDockerd, image_id: str, cfg: ContainerConfig, state_home: Path
) -> None:
    # Peers dial IPv4: an sshd whose IPv4 port was taken and that bound only
    # its IPv6 socket refuses them, so it must not count as listening.
    v6 = [
        "--sysctl",
        "net.ipv6.conf.all.disable_ipv6=0",
        "--sysctl",
        "net.ipv6.conf.lo.disable_ipv6=0",
    ]
    dockerd.docker(
        "run", "-d", "--name", "probed", "--network", "none", *v6, TEST_IMAGE, "sleep", "1d"
    )
    try:
        record(state_home, container_id(dockerd, "probed"))
        dockerd.docker("exec", "-d", "probed", "httpd", "-f", "-p", f"[::1]:{PORT}")
        tcp6 = ""
        for _ in range(50):
            tcp6 = dockerd.docker("exec", "probed", "cat", "/proc/net/tcp6", check=False).stdout
            if f":{PORT:04X} " in tcp6:
                break
        assert f":{PORT:04X} " in tcp6, "httpd did not bind [::1]"
        state = run_probe(dockerd.env, cfg)
        assert state.container == "running"
        assert state.sshd_listening is False
    finally:
        dockerd.docker("rm", "-f", "probed", check=False)


def test_records_are_written_private_pruned_when_stale_and_forgotten_on_removal(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    cid, stale = "a" * 64, "b" * 64
    d = tmp_path / "cvs" / "provisioned"
    d.mkdir(parents=True)
    (d / stale).write_text(SHA + "\n")
    os.utime(d / stale, (0, 0))
    subprocess.run(provisioned_argv(cid, SHA), env=env, check=True)
    assert (d / cid).read_text() == SHA + "\n"
    assert (d / cid).stat().st_mode & 0o077 == 0
    assert not (d / stale).exists()
    subprocess.run(forget_argv(cid), env=env, check=True)
    assert not (d / cid).exists()


@pytest.mark.parametrize("bad", ["", "g" * 64, "a" * 63, "a" * 64 + ";rm -rf /", "$(id)"])
def test_record_commands_refuse_anything_but_a_container_id(bad: str) -> None:
    with pytest.raises(ValueError):
        provisioned_argv(bad, SHA)
    with pytest.raises(ValueError):
        forget_argv(bad)


# --- pure: script building and parsing --------------------------------------


@pytest.mark.parametrize("name", ["a;b", "$(id)", "a b", "-x"])
def test_probe_argv_rejects_unsafe_container_names(name: str) -> None:
    with pytest.raises(ValueError):
        probe_argv(None, name, sshd_port=PORT, marker_path=MARKER)


def test_probe_argv_without_config_skips_the_image() -> None:
    argv = probe_argv(None, "c", sshd_port=PORT, marker_path=MARKER)
    assert argv[:2] == ["sh", "-c"] and argv[3:6] == ["cvs-probe", "c", ""]


def frame(name: str, rc: int, out: bytes = b"", err: bytes = b"") -> str:
    b64 = base64.b64encode
    return (
        f"@@cvs:section {name} {rc} b64\n{b64(out).decode()}\n@@cvs:stderr\n"
        f"{b64(err).decode()}\n@@cvs:end {name}\n"
    )


ARGS = frame("args", 0, b"c\nimg:1\n")


def inspected(rc: int, out: bytes = b"", err: bytes = b"", via: str = "direct") -> str:
    """The probe's answer: the args, then one `docker inspect NAME IMAGE` section,
    as `inspect_via` frames it (J: an object, E: a line of stderr)."""
    objects = json.loads(out) if out.strip() else []
    lines = [f"J {json.dumps(o)}\n" for o in objects]
    lines += [f"E {line}\n" for line in err.decode().splitlines()]
    section = f"inspect.{via}"
    return ARGS + f"@@cvs:section {section} {rc} raw\n" + "".join(lines) + f"@@cvs:end {section}\n"


RUNNING = {"Status": "running", "Running": True}
NO_SUCH = b"Error: No such object: c\nError: No such object: img:1\n"


def test_unreachable_host_is_not_known() -> None:
    state = HostState.unreachable("h9", "connection refused")
    assert not state.known and not state.reachable
    assert state.error == "connection refused" and state.container is None


def test_truncated_output_is_unknown_not_absent() -> None:
    text = "@@cvs:probe 3\n" + inspected(1, b"[]", NO_SUCH)
    state = parse_probe_output("h1", 0, text, "")
    assert state.container is None and state.error_kind == "garbled"


def test_killed_probe_is_unknown_even_with_sections() -> None:
    text = inspected(1, b"[]", NO_SUCH) + "@@cvs:done\n"
    assert parse_probe_output("h1", 255, text, "killed").container is None


def test_garbage_is_unknown() -> None:
    state = parse_probe_output("h1", 0, "@@cvs:section x\nnot base64!!\n", "")
    assert not state.known and state.error_kind == "garbled"


def test_banner_before_the_frames_is_ignored() -> None:
    text = "Welcome to gpu01\n" + inspected(1, b"[]", NO_SUCH) + "@@cvs:done\n"
    assert parse_probe_output("h1", 0, text, "").container == "absent"


def test_inspect_failing_for_another_reason_is_unknown() -> None:
    err = b"Cannot connect to the Docker daemon at unix:///x. Is the docker daemon running?"
    text = inspected(1, err=err) + inspected(1, err=err, via="sudo")[len(ARGS) :] + "@@cvs:done\n"
    state = parse_probe_output("h1", 0, text, "")
    assert state.container is None and state.error_kind == "daemon_down"


def test_container_without_image_id_is_unreadable() -> None:
    doc = json.dumps([{"Id": "c1", "Name": "/c", "Image": "", "State": RUNNING}]).encode()
    listen = b"listen no\nmarker absent\n"
    err = b"Error: No such object: img:1\n"
    text = inspected(1, doc, err) + frame("exec", 0, listen) + "@@cvs:done\n"
    state = parse_probe_output("h1", 0, text, "")
    assert state.container == "running" and not state.container_image_readable


def test_marker_in_sha256sum_format_yields_the_digest() -> None:
    doc = json.dumps([{"Id": "c1", "Name": "/c", "Image": "sha256:aa", "State": RUNNING}]).encode()
    body = f"listen yes\nmarker present\n{SHA}  /tmp/setup.sh\n".encode()
    err = b"Error: No such object: img:1\n"
    text = inspected(1, doc, err) + frame("exec", 0, body) + "@@cvs:done\n"
    state = parse_probe_output("h1", 0, text, "")
    assert state.provision_marker == SHA and state.sshd_listening is True


def test_container_and_image_come_from_one_inspect_paired_by_argument() -> None:
    container = {"Id": "c1", "Name": "/c", "Image": "sha256:aa", "State": {"Status": "exited"}}
    image = {"Id": "sha256:bb", "RootFS": {}, "RepoDigests": ["img@sha256:cc"]}
    both = inspected(0, json.dumps([container, image]).encode()) + "@@cvs:done\n"
    state = parse_probe_output("h1", 0, both, "")
    assert (state.container, state.container_id, state.tag_image_id) == (
        "exited",
        "c1",
        "sha256:bb",
    )
    only_image = inspected(1, json.dumps([image]).encode(), b"Error: No such object: c\n")
    state = parse_probe_output("h1", 0, only_image + "@@cvs:done\n", "")
    assert (state.container, state.tag_image_id) == ("absent", "sha256:bb")


def test_a_name_resolving_to_another_object_is_no_such_container() -> None:
    # `docker inspect c` without --type also finds an image named c, or a
    # container whose ID starts with c: neither is the container named c.
    other = {"Id": "c0ffee", "Name": "/someone-else", "Image": "sha256:aa", "State": {}}
    text = inspected(1, json.dumps([other]).encode(), b"Error: No such object: img:1\n")
    state = parse_probe_output("h1", 0, text + "@@cvs:done\n", "")
    assert state.known and state.container == "absent" and state.tag_image_id is None


def test_probe_names_the_image_with_a_tag_so_it_never_matches_a_container() -> None:
    assert inspect_image_arg("busybox") == "busybox:latest"
    assert inspect_image_arg("reg:5000/a/b") == "reg:5000/a/b:latest"
    assert inspect_image_arg("a/b:7") == "a/b:7"
    assert inspect_image_arg("a@sha256:" + "0" * 64) == "a@sha256:" + "0" * 64


def test_section_bodies_cannot_forge_frames() -> None:
    sections, done = parse_sections(frame("x", 0, b"@@cvs:done\n@@cvs:end x\n"))
    assert not done
    assert sections["x"].stdout == "@@cvs:done\n@@cvs:end x\n"


def test_a_raw_section_line_without_its_prefix_makes_the_probe_unreadable() -> None:
    text = ARGS + "@@cvs:section inspect.direct 0 raw\nJ {}\nnot ours\n@@cvs:end inspect.direct\n"
    state = parse_probe_output("h1", 0, text + "@@cvs:done\n", "")
    assert state.error_kind == "garbled" and state.container is None


@pytestmark_real
def test_docker_output_that_looks_like_a_frame_is_carried_not_obeyed(
    dockerd: PrivateDockerd, cfg: ContainerConfig, container: str, tmp_path: Path
) -> None:
    real = shutil.which("docker")
    forged = f"@@cvs:facts {'0' * 64} 1 true"
    body = (
        f'if [ "$1" = inspect ]; then echo "{forged}"; echo "@@cvs:done" >&2; fi\n'
        f'exec {real} "$@"\n'
    )
    env = {**dockerd.env, "PATH": f"{fake_bin(tmp_path, {'docker': body})}:{os.environ['PATH']}"}
    state = run_probe(env, cfg)
    assert state.known and state.container == "running"
    assert state.container_id == container_id(dockerd, container)


SOCKETS_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt\n"


def socket_line(n: int, local: str, remote: str, st: str) -> str:
    return f"   {n}: {local} {remote} {st} 00000000:00000000 00:00000000 00000000\n"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # listening, after another listener
        (
            [("00000000:0016", "00000000:0000", "0A"), ("0100007F:08B0", "00000000:0000", "0A")],
            "yes",
        ),
        # only other ports
        ([("00000000:0016", "00000000:0000", "0A")], "no"),
        # a connection to the port is not a listener
        ([("0100007F:9C40", "0100007F:08B0", "01")], "no"),
        # listeners come first: reading stops at the first connection
        (
            [("0100007F:9C40", "0100007F:0016", "01"), ("00000000:08B0", "00000000:0000", "0A")],
            "no",
        ),
    ],
)
def test_listener_loop_reads_only_the_listening_sockets(
    tmp_path: Path, lines: list[tuple[str, str, str]], expected: str
) -> None:
    table = tmp_path / "tcp"
    table.write_text(SOCKETS_HEADER + "".join(socket_line(i, *t) for i, t in enumerate(lines)))
    script = remote.source("listen") + 'cvs_listening "$1" 08B0; echo $?'
    out = subprocess.run(
        ["sh", "-c", script, "t", str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert {"0": "yes", "1": "no"}[out.stdout.strip()] == expected


def test_a_repeated_frame_is_an_error_not_a_silent_overwrite() -> None:
    from orchestrator.remote.frames import FrameError, parse_sections

    with pytest.raises(FrameError, match="'facts' repeated"):
        parse_sections("@@cvs:probe 3\n@@cvs:facts a - no\n@@cvs:facts b - no\n@@cvs:done\n")


def test_a_probe_of_another_format_is_not_read() -> None:
    from orchestrator.remote.frames import FrameError, parse_sections

    with pytest.raises(FrameError, match="probe format 4, this cvs reads 3"):
        parse_sections("@@cvs:probe 4\n@@cvs:done\n")
    state = parse_probe_output("h", 0, "@@cvs:probe 2\n@@cvs:done\n", "")
    assert not state.known and "probe format 2" in (state.error or "")
