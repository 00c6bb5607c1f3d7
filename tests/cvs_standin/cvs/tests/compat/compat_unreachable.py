"""A baremetal suite in the shape of CVS's, on a cluster with one host that cannot be reached."""

import json

import pytest


@pytest.fixture(scope="module")
def dead(pytestconfig):
    with open(pytestconfig.getoption("config_file")) as f:
        return json.load(f)["compat"]["unreachable"]


def test_unreachable_host_is_in_the_result_saying_why(orch, dead):
    out = orch.exec("echo hi")
    assert list(out) == orch.hosts
    assert "ABORT: Host Unreachable Error" in out[dead]
    assert all(out[h] == "hi\n" for h in orch.hosts if h != dead)


def test_unreachable_host_has_a_non_zero_exit_code(orch, dead):
    out = orch.exec("echo hi", detailed=True)
    assert out[dead]["exit_code"] != 0
    assert all(out[h] == {"output": "hi\n", "exit_code": 0} for h in orch.hosts if h != dead)


def test_baremetal_runs_on_the_host_os(orch):
    assert orch.exec_on_head("test -d /opt/compat || echo host-os") == {orch.head_node: "host-os\n"}
    assert orch.sudo_prefix() == "sudo -n "
