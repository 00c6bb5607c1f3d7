"""The programs cvs sends to hosts (orchestrator/remote/*.sh), run locally
under every /bin/sh a host may have: dash (Debian, Ubuntu), bash --posix
(RHEL, SLES) and busybox sh (minimal images). No root, no docker: stand-in
commands where a program calls docker. The real thing runs on the sandbox
(test_probe, test_provision, test_locks, test_cp, test_lifecycle)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator import remote
from orchestrator.config import ContainerConfig
from orchestrator.containers import provision
from orchestrator.containers.probe import HostState, parse_probe_output, probe_argv
from orchestrator.limits import gpus
from orchestrator.remote import records
from orchestrator.remote.frames import parse_sections, split_lock_frames
from orchestrator.remote.runtime import ContainerRuntime

REMOTE_DIR = Path(remote.__file__).parent
ID = "c" * 64
SHA = "ab" * 32

SHELLS = {"dash": ("dash",), "bash": ("bash", "--posix"), "busybox": ("busybox", "sh")}


@pytest.fixture(params=sorted(SHELLS))
def sh(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The host shell under test."""
    argv = SHELLS[request.param]
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed here")
    return argv


def run(sh: tuple[str, ...], argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    """`argv` (`sh -c PROGRAM $0 ARG…`) under the shell `sh`."""
    assert argv[:2] == ["sh", "-c"]
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 60)
    return subprocess.run([*sh, *argv[1:]], **kw)  # type: ignore[call-overload, no-any-return]


def stand_in(tmp_path: Path, name: str, body: str) -> dict[str, str]:
    """An environment whose PATH has `name` as the sh script `body` first."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    (d / name).write_text("#!/bin/sh\n" + body)
    (d / name).chmod(0o755)
    return {**os.environ, "PATH": f"{d}:{os.environ['PATH']}"}


# --- the files ---------------------------------------------------------------------


def test_every_program_and_library_is_a_file_in_the_package() -> None:
    on_disk = {p.stem for p in REMOTE_DIR.glob("*.sh")}
    assert on_disk == set(remote.PROGRAMS) | set(remote.LIBRARIES)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
@pytest.mark.sandbox  # starts real programs: out of the fast subset
def test_shellcheck_reads_every_program_as_posix_sh() -> None:
    files = sorted(str(p) for p in REMOTE_DIR.glob("*.sh"))
    out = subprocess.run(["shellcheck", "--shell=sh", *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("name", sorted(remote.PROGRAMS))
def test_every_program_as_sent_parses_under_the_shell(name: str, sh: tuple[str, ...]) -> None:
    out = subprocess.run([*sh, "-n", "-c", remote.program(name)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_no_program_is_built_by_text_replacement() -> None:
    # What varies is an argument: the text sent is the same on every call.
    a = probe_argv(None, "a", sshd_port=22, marker_path="/m")
    b = probe_argv(None, "b", sshd_port=2224, marker_path="/n", port_check=True)
    assert a[2] == b[2] == remote.program("probe")


def exit_codes(name: str) -> dict[str, int]:
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(EXIT_[A-Z_]+)=(\d+)", remote.source(name), re.MULTILINE)
    }


@pytest.mark.parametrize("name", ["setup", "sshd"])
def test_the_programs_exit_codes_are_the_ones_python_reads(name: str) -> None:
    codes = exit_codes(name)
    assert codes
    assert all(getattr(provision, k) == v for k, v in codes.items()), codes


def test_the_sshd_program_wants_the_files_python_sends() -> None:
    m = re.search(r'^FILES="([^"]*)"', remote.source("sshd"), re.MULTILINE)
    assert m is not None and tuple(m.group(1).split()) == provision.SSHD_FILES


def test_the_gpu_program_runs_the_queries_python_parses() -> None:
    text = remote.source("gpus")
    for query in (gpus.NVIDIA_QUERY, gpus.AMD_SMI_QUERY, gpus.ROCM_SMI_QUERY):
        assert " ".join(query) + " 2>/dev/null" in text


# --- listen.sh: the one "is it listening" ------------------------------------------

HEADER = "  sl  local_address rem_address   st tx_queue\n"


def listening(sh: tuple[str, ...], netdir: Path) -> int:
    script = remote.source("listen") + 'cvs_listening "$1" 08B0'
    return subprocess.run([*sh, "-c", script, "t", str(netdir)], timeout=30).returncode


def test_an_ipv4_listener_on_the_port_is_listening(sh: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "tcp").write_text(HEADER + "   0: 0100007F:08B0 00000000:0000 0A 0\n")
    assert listening(sh, tmp_path) == 0


def test_ipv6_alone_where_ipv4_exists_is_not_listening(sh: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "tcp").write_text(HEADER)
    (tmp_path / "tcp6").write_text(HEADER + "   0: 00000000000000000000000001000000:08B0 x 0A\n")
    assert listening(sh, tmp_path) == 1


def test_ipv6_counts_where_there_is_no_ipv4_table(sh: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "tcp6").write_text(HEADER + "   0: 00000000000000000000000001000000:08B0 x 0A\n")
    assert listening(sh, tmp_path) == 0


def test_no_socket_table_is_unknown(sh: tuple[str, ...], tmp_path: Path) -> None:
    assert listening(sh, tmp_path) == 2


def test_the_port_goes_to_proc_net_hex_in_the_shell(sh: tuple[str, ...]) -> None:
    out = subprocess.run([*sh, "-c", "printf '%04X' 2224"], capture_output=True, text=True)
    assert out.stdout == "08B0"


# --- records.sh / record.sh ----------------------------------------------------------


def test_records_are_written_read_back_and_forgotten(sh: tuple[str, ...], tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    assert run(sh, records.provisioned_argv(ID, SHA), env=env).returncode == 0
    adopted = run(sh, records.adopted_argv(ID, "my cluster"), env=env)
    assert adopted.returncode == 0 and adopted.stdout.strip() == f"adopted {ID[:12]}"
    read = remote.source("records") + 'cvs_records_read "$1"'
    out = subprocess.run([*sh, "-c", read, "r", ID], env=env, capture_output=True, text=True)
    assert out.returncode == 0
    sections, _ = parse_sections(out.stdout)
    assert records.adopted_records(sections) == {ID: "my cluster"}
    assert records.host_record(sections, "record", ID) == SHA
    assert (tmp_path / "cvs" / "provisioned").stat().st_mode & 0o077 == 0
    assert run(sh, records.forget_argv(ID), env=env).returncode == 0
    assert not list((tmp_path / "cvs").rglob(ID))


# --- probe.sh, check.sh ----------------------------------------------------------------


def test_the_probe_reads_an_absent_container_and_the_hosts_capacity(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    env = stand_in(
        tmp_path,
        "docker",
        'for a; do last=$a; done\necho "Error: No such object: $last" >&2\nexit 1\n',
    )
    env["DOCKER_HOST"] = "tcp://127.0.0.1:1"  # not a socket: plain docker first
    argv = probe_argv(None, "probed", sshd_port=2224, marker_path="/m")
    out = run(sh, argv, env=env)
    state = parse_probe_output("h", out.returncode, out.stdout, out.stderr)
    assert state.container == "absent" and state.access == "direct", out.stdout
    assert state.cpu_count is not None and state.memory_total is not None


def test_the_probe_lists_the_gpus_where_a_container_will_launch(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    env = stand_in(
        tmp_path,
        "docker",
        'for a; do last=$a; done\necho "Error: No such object: $last" >&2\nexit 1\n',
    )
    env = stand_in(
        tmp_path,
        "nvidia-smi",
        "echo '0, GPU-a, NVIDIA H100, 81559, 00000000:01:00.0'\n"
        "echo '1, GPU-b, NVIDIA H100, 81559, 00000000:02:00.0'\n",
    )
    env["DOCKER_HOST"] = "tcp://127.0.0.1:1"
    argv = probe_argv(
        None, "probed", sshd_port=2224, marker_path="/m", gpus="stopped", gpu_root=str(tmp_path)
    )
    out = run(sh, argv, env=env)
    state = parse_probe_output("h", out.returncode, out.stdout, out.stderr)
    assert state.container == "absent", out.stdout
    assert state.gpus is not None and [g.index for g in state.gpus] == [0, 1]
    assert {g.vendor for g in state.gpus} == {"nvidia"}


DOCKER_STAND_IN = """
case "$1" in
  version) echo "$VERSION" ;;
  *) for a; do last=$a; done; echo "Error: No such object: $last" >&2; exit 1 ;;
esac
"""


def _probe_version(sh: tuple[str, ...], tmp_path: Path, answer: str, when: str | None) -> HostState:
    env = stand_in(tmp_path, "docker", DOCKER_STAND_IN)
    env["DOCKER_HOST"] = "tcp://127.0.0.1:1"  # not a socket: plain docker first
    env["VERSION"] = answer
    argv = probe_argv(
        ContainerConfig(image="img:1"),
        "probed",
        sshd_port=2224,
        marker_path="/m",
        version=when,  # type: ignore[arg-type]
    )
    out = run(sh, argv, env=env)
    return parse_probe_output("h", out.returncode, out.stdout, out.stderr)


def test_the_real_probe_reads_the_daemons_version_when_asked(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    assert (
        _probe_version(sh, tmp_path, "20.10.24+dfsg1", "stopped").runtime_version
        == "20.10.24+dfsg1"
    )
    assert _probe_version(sh, tmp_path, "$(x) y", "stopped").runtime_version is None
    assert _probe_version(sh, tmp_path, "27.1.0", None).runtime_version is None


def test_the_in_container_check_reports_listener_and_marker(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    marker.write_text(SHA + "\n")
    (tmp_path / "tcp").write_text(HEADER + "   0: 0100007F:08B0 00000000:0000 0A 0\n")
    out = run(sh, remote.argv("check", "08B0", str(marker), str(tmp_path)))
    assert out.stdout.splitlines() == ["listen yes", "marker present", SHA]
    out = run(sh, remote.argv("check", "08B0", str(tmp_path / "none"), str(tmp_path / "x")))
    assert out.stdout.splitlines() == ["listen unknown", "marker absent"]


# --- lock.sh -------------------------------------------------------------------------


def lock_argv(lock: Path, mode: str, *then: str) -> list[str]:
    return remote.argv("lock", str(lock), mode, "no", "me pid 1: test", "none", *then)


def test_the_lock_runs_the_program_under_it_and_a_second_taker_is_busy(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    lock = tmp_path / "cvs-c-h.lock"
    holder = subprocess.Popen(
        [*sh, *lock_argv(lock, "x", 'echo "probed $1"', "arg1")[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        got = [holder.stdout.readline().strip() for _ in range(3)]
        assert got == ["@@cvs:lock held x", "probed arg1", "@@cvs:ready"]
        busy = run(sh, lock_argv(lock, "s"))
        status, holders, _ = split_lock_frames(busy.stdout)
        assert status == "busy" and holders == ["me pid 1: test"]
    finally:
        holder.communicate(timeout=30)
    assert not lock.exists()  # the last one out removed it


def _holder_with_guard(sh: tuple[str, ...], tmp_path: Path, lines: str) -> Path:
    """A lock holder given `lines` on stdin, then stdin closed; the file its
    guard (`echo ran > FILE`) would write."""
    mark = tmp_path / "guard-ran"
    holder = subprocess.Popen(
        [*sh, *lock_argv(tmp_path / "cvs-g-h.lock", "s")[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    holder.communicate(lines.replace("FILE", str(mark)), timeout=30)
    return mark


def test_a_lock_whose_coordinator_goes_without_a_word_runs_its_guard(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    mark = _holder_with_guard(sh, tmp_path, "guard T1\n  echo ran > 'FILE'\nT1\nrenew\n")
    assert mark.read_text() == "ran\n"


def test_a_lock_released_in_order_does_not_run_its_guard(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    mark = _holder_with_guard(sh, tmp_path, "guard T1\necho ran > 'FILE'\nT1\nrelease\n")
    assert not mark.exists()


def test_a_guard_cut_short_is_never_run(sh: tuple[str, ...], tmp_path: Path) -> None:
    mark = _holder_with_guard(sh, tmp_path, "guard T1\necho ran > 'FILE'\n")
    assert not mark.exists()


# --- runtime.sh: access where no probe said ------------------------------------------


def test_docker_reads_fall_back_to_sudo_when_plain_docker_fails(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    env = stand_in(tmp_path, "docker", 'echo "permission denied" >&2; exit 1\n')
    env = stand_in(tmp_path, "sudo", 'shift; echo "as root: $*"\n')
    env["DOCKER_HOST"] = "tcp://127.0.0.1:1"
    out = run(sh, ContainerRuntime().read(["inspect", "x"]), env=env)
    assert out.returncode == 0 and out.stdout == "as root: docker inspect x\n"


def test_a_container_not_running_is_one_line_and_exit_125(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    env = stand_in(tmp_path, "docker", "echo false\n")
    env = stand_in(tmp_path, "sudo", "exit 1\n")
    env["DOCKER_HOST"] = "tcp://127.0.0.1:1"
    out = run(sh, ContainerRuntime().when_running("c", ["exec", "c", "true"], "not here"), env=env)
    assert out.returncode == 125 and out.stderr == "not here\n"


# --- bounded.sh: a host step that a timeout stops whole ----------------------------------


def test_bounded_passes_its_stdin_and_exit_status_to_the_command(sh: tuple[str, ...]) -> None:
    # A background job's stdin is /dev/null unless redirected (dash, busybox).
    out = run(sh, remote.argv("bounded", "sh", "-c", "cat; exit 3"), input="the input\n")
    assert (out.returncode, out.stdout) == (3, "the input\n"), out.stderr


# --- run.sh + kill_tree.sh: `cvs exec` in the container --------------------------------


def test_a_command_reads_its_env_block_and_leaves_no_pidfile(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    argv = remote.argv("run", str(pidfile), "f" * 16, "sh", "-c", 'echo "$GREETING"; cat')
    out = run(sh, argv, input="export GREETING='hi there'\n" + "f" * 16 + "\nrest\n")
    assert out.returncode == 0 and out.stdout == "hi there\nrest\n"
    assert not pidfile.exists()


def test_kill_tree_stops_the_command_and_its_children(sh: tuple[str, ...], tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    argv = remote.argv("run", str(pidfile), "", "sh", "-c", "sleep 60 & sleep 60")
    started = subprocess.Popen([*sh, *argv[1:]])
    try:
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        assert run(sh, remote.argv("kill_tree", str(pidfile))).returncode == 0
        assert started.wait(timeout=10) != 0
    finally:
        started.kill()
    assert not pidfile.exists()


def test_kill_tree_of_a_session_stops_every_command_of_it(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    session = secrets.token_hex(4)
    pidfiles = [Path(f"/tmp/.cvs-exec-{session}{i}.pid") for i in range(2)]
    started = [
        subprocess.Popen([*sh, *remote.argv("run", str(p), "", "sleep", "60")[1:]])
        for p in pidfiles
    ]
    try:
        for _ in range(100):
            if all(p.exists() and p.read_text().strip() for p in pidfiles):
                break
            time.sleep(0.05)
        out = run(sh, remote.argv("kill_tree", "--session", session))
        assert out.returncode == 0 and sorted(out.stdout.split()) == sorted(
            ["ended", "ended", *map(str, pidfiles)]
        )
        assert all(p.wait(timeout=10) != 0 for p in started)
    finally:
        for p in started:
            p.kill()
        for f in pidfiles:
            f.unlink(missing_ok=True)
    assert not any(f.exists() for f in pidfiles)


def test_kill_tree_leaves_a_pid_that_is_no_longer_the_commands_alone(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    # A container restarted since: the pid in the file is another process now.
    other = subprocess.Popen(["sleep", "60"])
    pidfile = tmp_path / "pid"
    pidfile.write_text(f"{other.pid}\n")
    try:
        out = run(sh, remote.argv("kill_tree", str(pidfile)))
        assert out.returncode == 0 and out.stdout == ""
        assert other.poll() is None
        assert pidfile.exists()  # the evidence stays (containers/causes.py)
    finally:
        other.kill()


# --- copy_receive.sh / copy_send.sh ---------------------------------------------------


def test_a_copied_file_lands_checked_and_comes_back(sh: tuple[str, ...], tmp_path: Path) -> None:
    import hashlib

    data = b"payload\n"
    want = hashlib.sha256(data).hexdigest()
    dest = tmp_path / "d"
    argv = remote.argv("copy_receive", f"{dest}/", "f.txt", "file", "644", want)
    got = subprocess.run([*sh, *argv[1:]], input=data, capture_output=True, timeout=30)
    assert got.returncode == 0, got.stderr
    assert (dest / "f.txt").read_bytes() == data
    back = subprocess.run(
        [*sh, *remote.argv("copy_send", str(dest / "f.txt"))[1:]], capture_output=True
    )
    assert back.stdout == data and back.stderr.decode().split()[0] == want


def test_a_corrupted_copy_never_replaces_the_destination(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    dest = tmp_path / "f.txt"
    dest.write_text("old\n")
    argv = remote.argv("copy_receive", str(dest), "f.txt", "file", "644", "0" * 64)
    got = subprocess.run([*sh, *argv[1:]], input=b"new\n", capture_output=True, timeout=30)
    assert got.returncode == 1 and dest.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def _directory_payload(tmp_path: Path) -> bytes:
    from orchestrator.containers.copy import Payload

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(b"a" * 70000)
    (src / "sub" / "b").write_text("b\n")
    payload = Payload.from_path(src)
    try:
        return payload.read(0, payload.size)
    finally:
        payload.close()


def test_a_copied_directory_lands_whole_with_its_checksums(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    data = _directory_payload(tmp_path)
    dest = tmp_path / "d"
    argv = remote.argv("copy_receive", f"{dest}/", "src", "dir", "755", "")
    got = subprocess.run([*sh, *argv[1:]], input=data, capture_output=True, timeout=30)
    assert got.returncode == 0, got.stderr
    assert (dest / "src" / "a").read_bytes() == b"a" * 70000
    assert (dest / "src" / "sub" / "b").read_text() == "b\n"
    assert b"./sub/b" in got.stdout and b"@@cvs-final:" in got.stdout
    assert sorted(p.name for p in dest.iterdir()) == ["src"]  # no staging left


@pytest.mark.parametrize("cut", ["in-a-file", "between-files", "before-the-manifest"])
def test_a_cut_directory_stream_lands_nothing_and_leaves_nothing(
    sh: tuple[str, ...], tmp_path: Path, cut: str
) -> None:
    data = _directory_payload(tmp_path)
    # A cut between members is a valid archive to tar: only the manifest,
    # last, says the stream is whole.
    at = {
        "in-a-file": 30000,
        "between-files": data.index(b"./d/sub/b\0"),
        "before-the-manifest": data.index(b"./sha256\0"),
    }[cut]
    dest = tmp_path / "d"
    dest.mkdir()
    argv = remote.argv("copy_receive", f"{dest}/", "src", "dir", "755", "")
    got = subprocess.run([*sh, *argv[1:]], input=data[:at], capture_output=True, timeout=30)
    assert got.returncode != 0
    assert list(dest.iterdir()) == []


# --- setup.sh, setup_kill.sh, sshd.sh (their real runs are in containers) ---------


def test_a_setup_script_with_the_wrong_checksum_is_refused_unrun(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    marker = tmp_path / "m" / "provisioned"
    payload = provision.setup_payload(b"touch ran\n")
    out = run(sh, remote.argv("setup", "0" * 64, str(marker)), input=payload, cwd=tmp_path)
    assert out.returncode == provision.EXIT_CHECKSUM, out.stderr
    assert not marker.exists() and not (tmp_path / "ran").exists()


def test_the_setup_kill_without_a_running_script_does_nothing(sh: tuple[str, ...]) -> None:
    assert run(sh, remote.argv("setup_kill")).returncode == 0


def test_the_sshd_program_refuses_a_truncated_payload(sh: tuple[str, ...], tmp_path: Path) -> None:
    if not os.access("/usr/sbin/sshd", os.X_OK):
        pytest.skip("no /usr/sbin/sshd here: the program stops before the payload")
    argv = remote.argv("sshd", "2224", str(tmp_path / "hf"), "/p", "/c", "/k", "key", "kh", "")
    out = run(sh, argv, input="@@cvs-file host_key\naGk=\n@@cvs-end\n")
    assert out.returncode == provision.EXIT_BAD_PAYLOAD
    assert "truncated sshd payload" in out.stderr


# --- gpus.sh -----------------------------------------------------------------------


def test_gpu_discovery_without_gpus_finds_none(sh: tuple[str, ...], tmp_path: Path) -> None:
    out = run(sh, gpus.discovery_argv(str(tmp_path)), env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and gpus.parse_discovery(out.stdout) == []


# --- an image spread's receiver (spread_load.sh) ------------------------------------

# A load as podman 4.x does it from stdin: the archive copied to a file, the
# copy removed only when the load returns on its own (here: the stream ended
# cut, so it fails); TERMed or killed, the copy stays.
PODMAN_LIKE_LOAD = """copy="$LOAD_DIR/copy"
cat >"$copy"
rm -f "$copy"
echo "cut archive" >&2
exit 1
"""


@pytest.mark.parametrize("forward", ["0", "1"])
def test_a_receiver_passes_the_stream_to_its_load_and_on(
    sh: tuple[str, ...], tmp_path: Path, forward: str
) -> None:
    env = stand_in(tmp_path, "load", 'cat >"$LOAD_DIR/got"\n')
    data = secrets.token_bytes(300_000)
    out = subprocess.run([*sh, *remote.argv("spread_load", forward, "load")[1:]], input=data,
                         capture_output=True, env={**env, "LOAD_DIR": str(tmp_path)},
                         timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "got").read_bytes() == data
    assert out.stdout == (data if forward == "1" else b"")


@pytest.mark.parametrize("forward", ["0", "1"])
def test_a_receiver_stopped_mid_stream_ends_its_feed_first_and_its_load_removes_its_copy(
    sh: tuple[str, ...], tmp_path: Path, forward: str
) -> None:
    env = stand_in(tmp_path, "load", PODMAN_LIKE_LOAD)
    copy = tmp_path / "copy"
    # A session of its own, as sshd starts it.
    started = subprocess.Popen([*sh, *remote.argv("spread_load", forward, "load")[1:]],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, env={**env, "LOAD_DIR": str(tmp_path)},
                               start_new_session=True)  # fmt: skip
    assert started.stdin is not None
    try:
        started.stdin.write(secrets.token_bytes(100_000))
        started.stdin.flush()
        for _ in range(200):
            if copy.exists() and copy.stat().st_size >= 100_000:
                break
            time.sleep(0.05)
        assert copy.exists(), "the load never started"
        # cvs's stop: sshd sends TERM to the session's whole process group
        # (the program's, here); the channel stays open.
        os.killpg(started.pid, 15)
        started.wait(timeout=20)
    finally:
        if started.poll() is None:
            os.killpg(started.pid, 9)
            started.wait()
    assert started.returncode != 0
    assert not copy.exists()  # the load ended on a cut stream, not on a signal


@pytest.mark.skipif(shutil.which("setsid") is None, reason="setsid is not installed")
@pytest.mark.sandbox  # waits out the 5 s bound: out of the fast subset
def test_a_receiver_whose_load_ignores_the_cut_ends_it_after_the_bound(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    # A load that never reads its input: the cut stream does not end it.
    env = stand_in(
        tmp_path,
        "load",
        'echo "$$" >"$LOAD_DIR/pid.new"; mv "$LOAD_DIR/pid.new" "$LOAD_DIR/pid"; exec sleep 60\n',
    )
    pidfile = tmp_path / "pid"
    started = subprocess.Popen([*sh, *remote.argv("spread_load", "0", "load")[1:]],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**env, "LOAD_DIR": str(tmp_path)},
                               start_new_session=True)  # fmt: skip
    try:
        for _ in range(200):
            if pidfile.exists():
                break
            time.sleep(0.05)
        load = int(pidfile.read_text())
        os.killpg(started.pid, 15)  # sshd's TERM to the session's group
        started.wait(timeout=30)  # 5 s for the load, then its own session
        for _ in range(100):
            if not Path(f"/proc/{load}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{load}").exists(), "the load outlived its receiver"
    finally:
        if started.poll() is None:
            os.killpg(started.pid, 9)
            started.wait()
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int(pidfile.read_text()), 9)


# A save as podman 4.x does it to stdout: a temp copy under /var/tmp, removed
# only when the save returns; TERMed, or killed by SIGPIPE, it stays.
PODMAN_LIKE_SAVE = """temp="$SAVE_DIR/temp"
: >"$temp"
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  head -c 100000 /dev/zero || exit 1
  sleep "${SAVE_PAUSE:-0.02}"
done
rm -f "$temp"
"""


@pytest.mark.skipif(shutil.which("setsid") is None, reason="setsid is not installed")
def test_a_feeder_passes_its_save_whole_and_its_status(sh: tuple[str, ...], tmp_path: Path) -> None:
    env = stand_in(tmp_path, "save", PODMAN_LIKE_SAVE)
    for drain in ("0", "1"):
        out = subprocess.run([*sh, *remote.argv("spread_send", drain, "save")[1:]],
                             capture_output=True,
                             env={**env, "SAVE_DIR": str(tmp_path), "SAVE_PAUSE": "0"},
                             timeout=60, check=False)  # fmt: skip
        assert out.returncode == 0 and out.stdout == bytes(2_000_000), (drain, out.stderr)
        assert not (tmp_path / "temp").exists()


@pytest.mark.skipif(shutil.which("setsid") is None, reason="setsid is not installed")
def test_a_feeder_cut_mid_stream_with_drain_lets_its_save_end_and_remove_its_copy(
    sh: tuple[str, ...], tmp_path: Path
) -> None:
    if sh[0] == "busybox":
        pytest.skip("busybox sh runs its own tee, which has no -p: no drain (spread_send.sh)")
    env = stand_in(tmp_path, "save", PODMAN_LIKE_SAVE)
    temp = tmp_path / "temp"
    # A session of its own, as sshd starts it.
    started = subprocess.Popen([*sh, *remote.argv("spread_send", "1", "save")[1:]],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               env={**env, "SAVE_DIR": str(tmp_path)},
                               start_new_session=True)  # fmt: skip
    assert started.stdout is not None
    try:
        assert started.stdout.read(300_000) == bytes(300_000)
        # cvs's cut: sshd TERMs the session's process group, the channel closes.
        os.killpg(started.pid, 15)
        started.stdout.close()
        started.wait(timeout=20)
        for _ in range(100):  # the drained save ends by itself (0.4 s of stream)
            if not temp.exists():
                break
            time.sleep(0.1)
    finally:
        if started.poll() is None:
            os.killpg(started.pid, 9)
            started.wait()
    assert not temp.exists()  # TERMed, or killed by SIGPIPE, the save would have left it
