"""Which path a command in a container takes, and what the sshd path sends
(containers/sshexec.py): pure functions, no host. The paths themselves are
compared on the sandbox in test_sshexec_sandbox.py."""

from __future__ import annotations

import contextlib
import json
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import remote
from orchestrator.containers.route import ExecFacts, RuntimeExec, Sshd, login_user, sshd_address
from orchestrator.containers.sshexec import (
    DEFAULT_PATH,
    exec_env,
    parse_exec_facts,
    ssh_command,
)
from orchestrator.remote.runtime import ContainerRuntime


def _inspect(**over: Any) -> str:
    obj: dict[str, Any] = {
        "Id": "c" * 64,
        "State": {"Running": True, "StartedAt": "2026-11-27T10:00:00.1Z"},
        "Config": {
            "User": "",
            "WorkingDir": "/work",
            "Env": ["PATH=/opt/bin:/usr/bin", "A=b=c", "broken"],
            "Hostname": "node1",
            "Labels": {"io.cvs.sshd-port": "2299"},
        },
        "HostConfig": {"NetworkMode": "host"},
        "NetworkSettings": {"Networks": {}},
    }
    obj.update(over)
    return json.dumps([obj])


def _facts(**over: Any) -> ExecFacts:
    return parse_exec_facts(_inspect(**over))


def test_inspect_gives_env_in_order_user_workdir_and_the_labelled_port() -> None:
    facts = _facts()
    assert facts.env == (("PATH", "/opt/bin:/usr/bin"), ("A", "b=c"))
    assert (facts.user, facts.workdir, facts.sshd_port) == ("", "/work", 2299)
    assert facts.running and facts.container_id == "c" * 64


def test_inspect_without_a_container_is_refused() -> None:
    with pytest.raises(ValueError, match="no container"):
        parse_exec_facts("[{}]")
    with pytest.raises(ValueError, match="no JSON"):
        parse_exec_facts("Error: no such container")


def test_host_networking_reaches_the_sshd_on_the_loopback() -> None:
    assert sshd_address(_facts()) == "127.0.0.1"


def test_a_bridge_reaches_the_sshd_at_the_containers_ipv4_address() -> None:
    nets = {"Networks": {"bridge": {"IPAddress": "172.17.0.2"}, "v6": {"IPAddress": "fd00::2"}}}
    facts = _facts(HostConfig={"NetworkMode": "bridge"}, NetworkSettings=nets)
    assert sshd_address(facts) == "172.17.0.2"


@pytest.mark.parametrize("mode", ["none", "container:abc"])
def test_no_network_of_its_own_means_no_sshd_path(mode: str) -> None:
    assert sshd_address(_facts(HostConfig={"NetworkMode": mode})) is None


@pytest.mark.parametrize(
    ("requested", "image_user", "login"),
    [
        (None, "", "root"),
        ("root", "app", "root"),
        ("0", "app", "root"),
        (None, "app", "app"),
        ("app", "app:staff", "app"),
        ("other", "app", None),  # the sshd lets in root and the container's user only
        ("app:staff", "app", None),  # a group: docker exec -u gives exactly that
        ("1000", "app", None),  # a bare uid: no name to log in with
        (None, "app:staff", None),
    ],
)
def test_the_sshd_path_logs_in_only_as_a_user_it_can_give(
    requested: str | None, image_user: str, login: str | None
) -> None:
    facts = _facts(Config={"User": image_user, "Env": []})
    assert login_user(requested, facts) == login


def test_docker_env_is_its_default_path_and_hostname_then_the_containers_then_the_commands() -> (
    None
):
    facts = _facts()
    env = exec_env(facts, ContainerRuntime(), {"A": "mine"})
    assert env == {"PATH": "/opt/bin:/usr/bin", "HOSTNAME": "node1", "A": "mine"}
    bare = _facts(Config={"Env": [], "Hostname": "h"})
    assert exec_env(bare, ContainerRuntime(), {})["PATH"] == DEFAULT_PATH


def test_podman_env_is_the_containers_own() -> None:
    env = exec_env(_facts(), ContainerRuntime("sudo", "podman"), {})
    assert env == {"PATH": "/opt/bin:/usr/bin", "A": "b=c"}


def test_podman_exec_has_no_hostname_of_the_ones_its_inspect_adds() -> None:
    config = {"Env": ["HOSTNAME=node1", "A=b"], "Hostname": "node1"}
    podman = ContainerRuntime("sudo", "podman")
    assert exec_env(_facts(Config=config), podman, {}) == {"A": "b"}
    mine = {"Env": ["HOSTNAME=mine", "A=b"], "Hostname": "node1"}
    assert exec_env(_facts(Config=mine), podman, {})["HOSTNAME"] == "mine"


def test_values_travel_on_stdin_never_in_the_command_line() -> None:
    cmd = ssh_command(["echo", "hi"], {"SECRET": "s3cr3t value"}, workdir="/w", token="ab12")
    assert "s3cr3t" not in cmd.script
    assert "export SECRET='s3cr3t value'" in (cmd.stdin or "")
    words = shlex.split(cmd.script)
    assert words[:6] == ["sh", "-c", remote.program("ssh_run"), "cvs-ssh_run", "/w", "126"]
    assert words[6] == "/tmp/.cvs-exec-ab12.pid"
    assert words[-2:] == ["echo", "hi"]
    # ssh_run.sh's session set-up, then run.sh, in one shell
    assert remote.program("ssh_run").endswith(remote.program("run"))
    assert cmd.kill == shlex.join(remote.argv("kill_tree", "/tmp/.cvs-exec-ab12.pid"))


def test_a_directory_it_cannot_enter_exits_as_the_runtime_would() -> None:
    words = shlex.split(ssh_command("true", {}, workdir="/w", runtime="podman").script)
    assert words[4:6] == ["/w", "127"]


def test_a_relative_working_directory_is_refused() -> None:
    with pytest.raises(ValueError, match="absolute"):
        ssh_command("true", {}, workdir="tmp")


def test_how_commands_reach_the_container_is_not_part_of_its_config_hash() -> None:
    from orchestrator.config import ContainerConfig
    from orchestrator.containers.labels import config_hash

    on = ContainerConfig(image="img:1")
    off = ContainerConfig(image="img:1", sshd={"exec": False})
    other_port = ContainerConfig(image="img:1", sshd={"port": 2299})
    assert config_hash(on) == config_hash(off) != config_hash(other_port)


class _Channel:
    """What `coalesce_writes` wraps: records the writes that reach the channel."""

    def __init__(self) -> None:
        self.sent: list[bytes | str] = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def write_eof(self) -> None:
        self.sent.append("eof")

    def close(self) -> None:
        self.sent.append("close")

    def abort(self) -> None:
        self.sent.append("abort")


def test_tunnel_writes_of_one_loop_turn_leave_as_one_message() -> None:
    import anyio

    from orchestrator.ssh.segments import coalesce_writes

    async def main() -> list[bytes | str]:
        chan = _Channel()
        coalesce_writes(chan)
        chan.write(b"ignore-packet")
        chan.write(b"real-packet")
        assert chan.sent == []  # nothing until the loop turns
        await anyio.sleep(0)
        chan.write(b"later")
        chan.close()  # what ends the channel sends what is pending first
        return chan.sent

    assert anyio.run(main) == [b"ignore-packetreal-packet", b"later", "close"]


# --- a copy's in-container end (containers/copy.py) -----------------------------


class _Pool:
    """A host runner whose held processes are recorded, not run."""

    def __init__(self) -> None:
        self.scripts: list[str] = []

    @contextlib.asynccontextmanager
    async def held_process(self, host: str, held: Any) -> Any:
        self.scripts.append(held.command)
        raise OSError("not a host")
        yield


class _SSHExec:
    """A routed sshd path: `way` for every host, `process` (or a RuntimeExec:
    it did not start) from a held process."""

    def __init__(self, way: Any, process: Any = "through the sshd") -> None:
        self.way, self.process = way, process
        self.asked: list[tuple[str, list[str]]] = []

    async def route(self, host: str, runtime: ContainerRuntime, user: str | None) -> Any:
        return self.way

    async def held_process(
        self, stack: Any, way: Any, host: str, argv: list[str], *, runtime: ContainerRuntime
    ) -> Any:
        assert way is self.way
        self.asked.append((host, argv))
        return self.process


_SSHD = Sshd(
    "127.0.0.1",
    2224,
    "root",
    "ssh-ed25519 AAAA",
    "/",
    ExecFacts("c", True, "", "", "", (), "h1", "host", (), None),
)


def _open(ssh_exec: Any, pool: Any) -> Any:
    from orchestrator.containers.copy import _opener

    open_ = _opener(
        pool, "h1", "DOCKER EXEC SCRIPT", ["sh", "-c", "x"], ssh_exec, ContainerRuntime()
    )

    async def main() -> Any:
        async with contextlib.AsyncExitStack() as stack:
            return await open_(stack)

    return anyio.run(main)


def test_a_copy_routed_to_the_containers_sshd_takes_it() -> None:
    pool, ssh_exec = _Pool(), _SSHExec(_SSHD)
    assert _open(ssh_exec, pool) == "through the sshd"
    assert ssh_exec.asked == [("h1", ["sh", "-c", "x"])] and pool.scripts == []


def test_a_copy_routed_to_the_runtime_goes_through_docker_exec() -> None:
    pool, ssh_exec = _Pool(), _SSHExec(RuntimeExec("one host"))
    with pytest.raises(OSError, match="not a host"):
        _open(ssh_exec, pool)
    assert ssh_exec.asked == [] and pool.scripts == ["DOCKER EXEC SCRIPT"]


def test_a_copy_that_did_not_start_at_the_sshd_goes_through_docker_exec() -> None:
    pool, ssh_exec = _Pool(), _SSHExec(_SSHD, process=RuntimeExec("refused"))
    with pytest.raises(OSError, match="not a host"):
        _open(ssh_exec, pool)
    assert pool.scripts == ["DOCKER EXEC SCRIPT"]


def test_a_copy_to_the_hosts_own_os_never_asks_the_containers_sshd(tmp_path: Path) -> None:
    from orchestrator.config import load_cluster
    from orchestrator.containers.copy import Payload, copy_to_hosts

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "hosts: [{name: h1, address: 10.0.0.1}, {name: h2, address: 10.0.0.2}]\n"
        "container: {image: 'img:1'}\n"
    )
    source = tmp_path / "f.txt"
    source.write_text("f\n")
    pool: Any = _Pool()
    ssh_exec: Any = _SSHExec(_SSHD)
    payload = Payload.from_path(source)
    try:
        results = anyio.run(
            lambda: copy_to_hosts(
                pool,
                load_cluster(cluster),
                payload,
                "/tmp/",
                hosts=["h1", "h2"],
                host_os=True,
                ssh_exec=ssh_exec,
            )
        )
    finally:
        payload.close()
    assert ssh_exec.asked == [] and len(pool.scripts) == 2
    assert {r.status for r in results.values()} == {"unreachable"}


def test_keys_a_cold_start_of_the_same_invocation_makes_open_the_sshd_path(
    tmp_path: Path,
) -> None:
    import asyncssh

    from orchestrator.config import ClusterConfig
    from orchestrator.containers.sshexec import SSHExec
    from orchestrator.ssh.keys import USER_KEY_FILE
    from orchestrator.ssh.transport import SSHPool

    config = ClusterConfig.model_validate(
        {
            "hosts": [{"name": "node1"}, {"name": "node2"}],
            "state_dir": str(tmp_path),
            "container": {"image": "img:1", "name": "c1", "lifetime": "persistent"},
        }
    )
    pool = SSHPool(config)  # nothing connects: the key is only kept
    ssh_exec = SSHExec(config, pool, sink=None)  # type: ignore[arg-type]
    assert not ssh_exec._on()  # no keys yet: docker exec
    assert pool.containers is None
    keys = tmp_path / "keys"
    keys.mkdir()
    key = asyncssh.generate_private_key("ssh-ed25519")
    (keys / USER_KEY_FILE).write_bytes(key.export_private_key())
    assert ssh_exec._on()  # `up` made them: the next command takes the sshd
    assert pool.containers is not None  # the pool's, given the key


def _keyed_config(tmp_path: Path) -> Any:
    """A two-host cluster whose state directory holds the keys `up` makes."""
    import asyncssh

    from orchestrator.config import ClusterConfig
    from orchestrator.ssh.keys import USER_KEY_FILE

    keys = tmp_path / "keys"
    (keys / "hosts").mkdir(parents=True)
    key = asyncssh.generate_private_key("ssh-ed25519")
    (keys / USER_KEY_FILE).write_bytes(key.export_private_key())
    host_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    (keys / "hosts" / "node1_ed25519.pub").write_text(host_key)
    return ClusterConfig.model_validate(
        {
            "hosts": [
                {"name": "node1", "address": "127.0.0.1"},
                {"name": "node2", "address": "127.0.0.1"},
            ],
            "state_dir": str(tmp_path),
            "container": {"image": "img:1", "name": "c1", "lifetime": "persistent"},
        }
    )


def test_a_pool_ends_its_background_work_on_close_and_passes_the_callers_error_on(
    tmp_path: Path,
) -> None:
    from orchestrator.ssh.transport import SSHPool

    ended: list[bool] = []

    async def forever() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            ended.append(True)

    async def main() -> None:
        async with SSHPool(_keyed_config(tmp_path)) as pool:
            assert pool.background is not None
            pool.background.start_soon(forever)
            await anyio.sleep(0)
            raise KeyError("the caller's")

    with pytest.raises(KeyError):  # as raised: in no ExceptionGroup
        anyio.run(main)
    assert ended == [True]


def test_a_warm_up_runs_in_the_pools_group_and_ends_with_the_pool(
    tmp_path: Path,
) -> None:
    from orchestrator.containers.sshexec import SSHExec
    from orchestrator.events import CollectingSink
    from orchestrator.ssh.transport import SSHPool

    warming = anyio.Event()
    ended: list[str] = []

    async def never_answers(ep: Any) -> bool:
        warming.set()
        try:
            await anyio.sleep_forever()
        finally:
            ended.append(ep.host)
        return True

    async def main() -> None:
        config = _keyed_config(tmp_path)
        with anyio.fail_after(5):
            async with SSHPool(config) as pool:
                ssh_exec = SSHExec(config, pool, CollectingSink())
                pool.warm = never_answers  # type: ignore[method-assign]
                ssh_exec.warm_up(["node1", "node2"])  # node2: no host key, no warm-up
                await warming.wait()
        assert ended == ["node1"]

    anyio.run(main)
