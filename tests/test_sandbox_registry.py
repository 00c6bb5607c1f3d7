"""`cvs sandbox up --registry [--registry-rate RATE]`: the cluster's image in
a registry of the sandbox's own, in a network namespace of its own whose link
is shaped with tc, and `sandbox down` taking all of it away again."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from clitools import cvs, cvs_in_process, explain
from labtools import docker

from orchestrator.sandbox import Sandbox, network, sandbox_down
from orchestrator.sandbox.images import MPI_TAG
from orchestrator.sandbox.registry import (
    REGISTRY_USER,
    config_digest,
    image_bytes,
    netns_registry_dir,
)


def registry_env(sb: Sandbox) -> dict[str, str]:
    """The `export NAME=value` lines of DIR/registry.env."""
    pairs = (
        line.removeprefix("export ").split("=", 1)
        for line in sb.registry_env_file.read_text().splitlines()
        if line.startswith("export ")
    )
    return dict(pairs)  # type: ignore[arg-type]


def tx_bytes(env: dict[str, str]) -> int:
    path = f"/sys/class/net/{env['REGISTRY_IF']}/statistics/tx_bytes"
    argv = ["ip", "netns", "exec", env["REGISTRY_NETNS"], "cat", path]
    return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def password(sb: Sandbox) -> str:
    return (netns_registry_dir(sb.run_dir) / "password").read_text().strip()


def has_image(sb: Sandbox, host: str, ref: str) -> bool:
    return bool(docker(sb, host, "images", "-q", ref))


def image_id(sb: Sandbox, host: str, ref: str) -> str:
    """`ref`'s image ID on `host` (hex: podman's has no sha256: before it), "" where none."""
    out = docker(sb, host, "image", "inspect", "-f", "{{.Id}}", ref, check=False)
    return out.strip().removeprefix("sha256:")


def test_the_registry_runs_in_a_namespace_of_its_own_with_its_link_shaped(
    registry_sandbox: Sandbox,
) -> None:
    sb = registry_sandbox
    ns = network.registry_netns_name(sb.index)

    qdisc = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", network.REGISTRY_INTERFACE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    in_ns = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout

    assert "tbf" in qdisc and "rate 200Mbit" in qdisc, qdisc
    assert sb.registry_pid is not None and str(sb.registry_pid) in in_ns.split()


def test_registry_env_names_the_registry_its_namespace_and_the_interface_that_counts(
    registry_sandbox: Sandbox,
) -> None:
    sb = registry_sandbox
    env = registry_env(sb)
    cluster = yaml.safe_load(sb.cluster_file.read_text())

    assert env["REGISTRY"] == f"{network.registry_address(sb.index)}:5000"
    assert env["REGISTRY_NETNS"] == network.registry_netns_name(sb.index)
    assert env["REGISTRY_IF"] == network.REGISTRY_INTERFACE
    assert tx_bytes(env) >= 0
    image = cluster["container"]["image"]
    assert image == env["REGISTRY_IMAGE"] and image.startswith(env["REGISTRY"] + "/")
    assert cluster["container"]["registry"]["username"] == REGISTRY_USER
    assert not any(has_image(sb, h.name, image) for h in sb.nodes)


def test_every_host_pulls_the_image_through_the_registry_which_serves_its_compressed_size(
    registry_sandbox: Sandbox, tmp_path: Path
) -> None:
    sb = registry_sandbox
    env = registry_env(sb)
    image = env["REGISTRY_IMAGE"]
    size = image_bytes(image, REGISTRY_USER, password(sb))
    # Every host pulls (distribute: registry), not the spread's one pull.
    doc = yaml.safe_load(sb.cluster_file.read_text())
    doc["container"]["distribute"] = "registry"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(doc))
    before = tx_bytes(env)
    try:
        up = cvs("up", cluster=cluster, timeout=600)
        served = tx_bytes(env) - before

        assert up.returncode == 0, explain(up)
        assert all(has_image(sb, h.name, image) for h in sb.nodes)
        # Two pulls of S, plus HTTP and TCP's own bytes (a few percent).
        assert 2 * size <= served <= 2 * size * 1.1 + 1_000_000, (served, size)
    finally:
        cvs("down", "--force", cluster=cluster, timeout=300)
        for h in sb.nodes:
            docker(sb, h.name, "rmi", image, check=False)


def test_a_podman_fleet_pulls_through_the_registry_over_plain_http_told_by_the_cluster_file(
    make_sandbox: Callable[..., Sandbox], tmp_path: Path
) -> None:
    sb = make_sandbox(2, runtime="podman", registry=True)
    env = registry_env(sb)
    doc = yaml.safe_load(sb.cluster_file.read_text())
    image = doc["container"]["image"]
    # The sandbox says "plain HTTP" in the cluster file, not in the hosts'
    # registries.conf (which names only the bridge's gateway).
    assert doc["container"]["registry_tls_verify"] is False
    assert (
        env["REGISTRY"].split(":")[0] not in (sb.nodes[0].host_dir / "registries.conf").read_text()
    )
    assert not any(has_image(sb, h.name, image) for h in sb.nodes)
    doc["container"]["distribute"] = "registry"  # every host pulls
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(doc))
    before = tx_bytes(env)
    try:
        up = cvs("--json", "up", cluster=cluster, timeout=600)
        served = tx_bytes(env) - before

        assert up.returncode == 0, explain(up)
        assert all(has_image(sb, h.name, image) for h in sb.nodes)
        docs = [json.loads(x) for x in up.stdout.splitlines() if x.startswith("{")]
        hosts = docs[-1]["hosts"]
        for h in sb.nodes:
            steps = hosts[h.name]["steps"]
            assert steps.get("login") == "ok" and steps.get("pull") == "ok", (h.name, steps)
        assert served > 1_000_000, served  # the image's bytes came from the registry
        # podman's pull shows its bytes too (read from its own progress lines).
        progress = [e for e in docs if e.get("event") == "ImageProgress"]
        for h in sb.nodes:
            mine = [e for e in progress if e["host"] == h.name]
            assert mine and all(e["source"] == "registry" for e in mine), (h.name, mine)
            assert 0 < mine[-1]["done"] <= mine[-1]["total"] * 1.01, mine[-1]
    finally:
        cvs("down", "--force", cluster=cluster, timeout=300)


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_a_spread_to_three_hosts_pulls_once_and_every_host_ends_with_the_registrys_image_id(
    make_sandbox: Callable[..., Sandbox], tmp_path: Path, runtime: str
) -> None:
    sb = make_sandbox(3, runtime=runtime, registry=True)
    env = registry_env(sb)
    image = env["REGISTRY_IMAGE"]
    size = image_bytes(image, REGISTRY_USER, password(sb))
    registry_id = config_digest(image, REGISTRY_USER, password(sb))
    doc = yaml.safe_load(sb.cluster_file.read_text())
    assert "distribute" not in doc["container"]  # auto, the default: the spread
    doc["container"]["lifetime"] = "per_run"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(doc))
    plan = cvs("plan", cluster=cluster, timeout=300)
    assert "node1 pulls" in plan.stdout and "fetches: 1 (registry mode: 3)" in plan.stdout, explain(
        plan
    )
    before = tx_bytes(env)
    try:
        up = cvs("--json", "up", cluster=cluster, timeout=600)
        served = tx_bytes(env) - before

        assert up.returncode == 0, explain(up)
        hosts = json.loads(up.stdout.splitlines()[-1])["hosts"]
        assert hosts["node1"]["steps"].get("pull") == "ok", hosts["node1"]
        for h in ("node2", "node3"):
            steps = hosts[h]["steps"]
            assert steps.get("spread") == "ok" and "pull" not in steps, (h, steps)
        assert all(hosts[h.name]["ok"] is True for h in sb.nodes), hosts
        ids = {h.name: image_id(sb, h.name, image) for h in sb.nodes}
        assert set(ids.values()) == {registry_id.removeprefix("sha256:")}, (ids, registry_id)
        # One pull of S (plus HTTP's and TCP's own bytes), not three.
        assert size <= served < 1.3 * size, (served, size)
    finally:
        cvs("down", "--force", cluster=cluster, timeout=300)


def test_with_mpi_the_registry_holds_the_mpi_image_and_no_node_has_it(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    sb = make_sandbox(2, mpi=True, registry=True)
    env = registry_env(sb)
    image = yaml.safe_load(sb.cluster_file.read_text())["container"]["image"]

    assert image == env["REGISTRY_IMAGE"] == f"{env['REGISTRY']}/cvs/mpi:pushed"
    assert image_bytes(image, REGISTRY_USER, password(sb)) > 50_000_000
    for h in sb.nodes:
        assert not has_image(sb, h.name, image) and not has_image(sb, h.name, MPI_TAG)


def test_sandbox_down_leaves_no_registry_namespace_process_or_file(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    sb = make_sandbox(1, registry=True, registry_rate="50mbit")
    ns, link = network.registry_netns_name(sb.index), network.registry_veth_name(sb.index)
    pid = sb.registry_pid
    assert network.netns_exists(ns) and network.link_exists(link) and pid is not None

    sandbox_down(sb.directory)

    assert not network.netns_exists(ns) and not network.link_exists(link)
    assert not Path(f"/proc/{pid}").exists()
    assert not sb.registry_env_file.exists() and not sb.registry_data.exists()
    assert not netns_registry_dir(sb.run_dir).exists()


def test_sandbox_down_after_a_crash_that_lost_the_registry_pid_still_removes_it(
    make_sandbox: Callable[..., Sandbox],
) -> None:
    sb = make_sandbox(1, registry=True)
    ns = network.registry_netns_name(sb.index)
    pid = sb.registry_pid
    state = json.loads(sb.state_file.read_text())
    state["registry_pid"] = None  # `up` killed between starting it and saving its pid
    sb.state_file.write_text(json.dumps(state))

    sandbox_down(sb.directory)

    assert not network.netns_exists(ns)
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize("rate", ["fast", "20mbps", "20 mbit", "0mbit", "20mbit;x"])
def test_a_bad_registry_rate_is_refused_before_anything_is_built(tmp_path: Path, rate: str) -> None:
    directory = tmp_path / "sb"

    proc = cvs_in_process("sandbox", "up", "--hosts", "1", "--registry", "--registry-rate", rate,
                          "--dir", str(directory))  # fmt: skip

    assert proc.returncode == 2, explain(proc)
    assert "is not a rate" in proc.stderr and "20mbit" in proc.stderr, explain(proc)
    assert len(proc.stderr.strip().splitlines()) == 1, explain(proc)
    assert not directory.exists()


def test_a_registry_rate_without_the_registry_is_refused(tmp_path: Path) -> None:
    sb = tmp_path / "sb"
    proc = cvs_in_process("sandbox", "up", "--registry-rate", "20mbit", "--dir", str(sb))

    assert proc.returncode == 2, explain(proc)
    assert "add --registry" in proc.stderr, explain(proc)
    assert not (tmp_path / "sb").exists()


def test_rates_tc_reads_are_accepted_whole() -> None:
    for rate in ("20mbit", "512kbit", "1gbit", "800bit"):
        assert network.check_rate(rate) == rate


def shaped(env: dict[str, str], rate: str) -> None:
    """The registry's link at `rate` (tbf, as `sandbox up --registry-rate`)."""
    subprocess.run(
        ["ip", "netns", "exec", env["REGISTRY_NETNS"], "tc", "qdisc", "replace", "dev",
         env["REGISTRY_IF"], "root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"],
        check=True,
    )  # fmt: skip


def test_every_host_pulling_shows_its_bytes_growing_to_the_total_at_most_once_a_second(
    registry_sandbox: Sandbox, tmp_path: Path
) -> None:
    sb = registry_sandbox
    env = registry_env(sb)
    image = env["REGISTRY_IMAGE"]
    size = image_bytes(image, REGISTRY_USER, password(sb))
    doc = yaml.safe_load(sb.cluster_file.read_text())
    doc["container"]["distribute"] = "registry"
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(doc))
    # Slow enough for several seconds of pull (the fixture's 200mbit is ~1 s).
    shaped(env, "40mbit")
    try:
        up = cvs("--json", "up", cluster=cluster, timeout=600)

        assert up.returncode == 0, explain(up)
        events = [json.loads(x) for x in up.stdout.splitlines() if x.startswith("{")]
        progress = [e for e in events if e.get("event") == "ImageProgress"]
        for h in sb.nodes:
            mine = [e for e in progress if e["host"] == h.name]
            assert len(mine) >= 3, (h.name, mine)  # >= 2 during, 1 at the end
            done = [e["done"] for e in mine]
            assert done == sorted(done) and done[0] < done[-1], done
            last = mine[-1]
            # The layers' sizes (the config, a few KB, is not a layer's).
            assert last["done"] == last["total"] and 0.9 * size <= last["total"] <= 1.01 * size
            assert all(e["source"] == "registry" for e in mine)
            # At most once a second (the last, at the end, may come sooner).
            gaps = [b["ts"] - a["ts"] for a, b in itertools.pairwise(mine[:-1])]
            assert all(g >= 0.99 for g in gaps), gaps
    finally:
        shaped(env, "200mbit")
        cvs("down", "--force", cluster=cluster, timeout=300)
        for h in sb.nodes:
            docker(sb, h.name, "rmi", image, check=False)
