"""A test suite in the shape of CVS's, run after compat_install.py in a new `cvs run`."""

import json
import re
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def config_dict(pytestconfig):
    with open(pytestconfig.getoption("config_file")) as f:
        return json.load(f)["compat"]


def test_install_survived(orch, config_dict):
    out = orch.exec("cat /opt/compat/token; /opt/compat/bin/compat-tool")
    for host, output in out.items():
        assert output == f"{config_dict['token']}\ncompat-tool ok\n", host


def test_exec_returns_stdout_and_stderr_as_one_string(orch):
    out = orch.exec("echo to-out; echo to-err >&2", print_console=False)
    assert list(out) == orch.hosts
    assert all(o == "to-out\nto-err\n" for o in out.values())


def test_detailed_gives_output_and_exit_code(orch):
    out = orch.exec("echo failing; exit 3", detailed=True)
    assert out == {h: {"output": "failing\n", "exit_code": 3} for h in orch.hosts}


def test_timeout_is_a_wall_clock_cap_that_stops_the_command(orch):
    start = time.monotonic()
    out = orch.exec("sleep 30; echo never", timeout=2, detailed=True)
    assert time.monotonic() - start < 15
    for result in out.values():
        assert result["exit_code"] == -1  # CVS: unknown / aborted
        assert "ABORT: Timeout Error in Host" in result["output"]
        assert "never" not in result["output"]
    procs = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
    left = orch.exec(f"{procs} | grep -c '[s]leep 30' || true")
    assert all(o.strip() == "0" for o in left.values()), left


def test_exec_on_a_subset_of_hosts(orch):
    out = orch.exec("echo subset", hosts=orch.hosts[1:])
    assert out == {h: "subset\n" for h in orch.hosts[1:]}


def test_exec_on_head_runs_on_the_first_host(orch):
    assert orch.head_node == orch.hosts[0]
    out = orch.exec_on_head("cat /opt/compat/whoami", detailed=True)
    assert out == {orch.head_node: {"output": f"{orch.head_node}\n", "exit_code": 0}}


def test_exec_cmd_list_runs_one_command_per_host(orch):
    out = orch.exec_cmd_list([f"echo {i}; cat /opt/compat/whoami" for i in range(len(orch.hosts))])
    assert out == {h: f"{i}\n{h}\n" for i, h in enumerate(orch.hosts)}


def test_commands_run_in_the_container_and_host_handles_on_the_host(orch):
    inside = orch.exec("test -f /opt/compat/token && echo container", detailed=True)
    assert all(r == {"output": "container\n", "exit_code": 0} for r in inside.values())
    outside = orch.exec_on_host("test -f /opt/compat/token || echo host")
    assert outside == {h: "host\n" for h in orch.hosts}
    assert orch.all.exec("test -f /opt/compat/token || echo host") == outside
    assert orch.head.exec("echo head") == {orch.head_node: "head\n"}


def test_container_surface(orch):
    image = orch.container_config["image"]
    name = orch.get_container_name(orch.container_config, image)
    assert name == orch.container_config["name"]
    assert orch.verify_containers_running(name) is True
    assert orch.verify_containers_running("no-such-container") is False
    assert orch.sudo_prefix() == ""
    assert orch.user


def test_setup_env_runs_the_script_everywhere(orch):
    assert orch.setup_env(orch.hosts, "/opt/compat/env.sh") is True
    assert orch.setup_env(orch.hosts, "/opt/compat/missing.sh") is False
    assert orch.setup_env(orch.hosts) is True


def test_distribute_using_mpi_over_the_provisioned_hostfile(orch):
    # The hosts of the MPI hostfile cvs-orchestrator wrote into every container.
    hostfile = orch.exec_on_head("cat /etc/cvs/hostfile")[orch.head_node]
    mpi_hosts = [line.split()[0] for line in hostfile.splitlines() if line.strip()]
    assert mpi_hosts == orch.hosts
    out = orch.distribute_using_mpi(
        "sh -c 'echo rank=$RANK host=$(cat /opt/compat/whoami) var=$COMPAT_VAR'",
        mpi_hosts,
        2,
        {"COMPAT_VAR": "two words"},
        "/opt/compat/mpi/bin",
    )
    lines = sorted(out[orch.head_node].splitlines())
    ranks = sorted(
        (int(m.group(1)), m.group(2))
        for m in (re.fullmatch(r"rank=(\d+) host=(\S+) var=two words", line) for line in lines)
        if m
    )
    expected = [(r, h) for r, h in enumerate(h for h in mpi_hosts for _ in range(2))]
    assert ranks == expected, out


def test_host_handles_move_files_as_cvs_pssh_does(orch, tmp_path):
    # The sandbox's hosts share one filesystem: one path per host where they differ.
    src = tmp_path / "payload.txt"
    src.write_text("a\tb\n")
    remote = f"/tmp/compat-upload-{orch.container_config['name']}"
    orch.all.upload_file(str(src), f"{remote}.txt")
    out = orch.all.exec(f"cat {remote}.txt", detailed=True)
    # CVS's output shape: tabs as three spaces.
    assert out == {h: {"output": "a   b\n", "exit_code": 0} for h in orch.hosts}
    got = orch.all.download_file(f"{remote}.txt", str(tmp_path / "back"))
    assert got == {h: str(tmp_path / f"back_{h}") for h in orch.hosts}
    assert all(Path(p).read_text() == "a\tb\n" for p in got.values())
    per_host = {h: (str(src), f"{remote}.{i}") for i, h in enumerate(orch.hosts)}
    assert orch.all.upload_file_list(per_host) == {h: f"{h}: SUCCESS" for h in orch.hosts}
    out = orch.all.exec("echo first; sleep 1; echo second", inactivity_timeout=10)
    assert out == {h: "first\nsecond\n" for h in orch.hosts}
    with pytest.raises(OSError, match="upload_file"):
        orch.head.upload_file(str(tmp_path / "missing"), f"{remote}.x")
    orch.all.destroy_clients()  # CVS's: here the connections stay the orchestrator's
    orch.all.exec(f"rm -f {remote}.txt {remote}.0 {remote}.1 {remote}.2", print_console=False)
    assert orch.head.exec("echo still") == {orch.head_node: "still\n"}
