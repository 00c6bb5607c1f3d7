"""Resource caps and GPU subsets end to end, on the real sandbox (issue 6).

Every test drives the `cvs` CLI in a subprocess (CI=1: plain output) against a
cluster file derived from the sandbox's, with its own container name, and
removes its containers from every sandbox host afterwards, also on failure.

Stand-in GPUs are character devices with /dev/null's numbers (1, 3) under a
device root made for the test, plus the sysfs entries the discovery script
reads for the PCI vendor; hosts point at them with `gpu_device_root`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import cvs as run_cvs
from clitools import last_json
from gpuroots import AMD, NVIDIA, make_device_root

from orchestrator.sandbox import Sandbox

REPO = Path(__file__).resolve().parent.parent
MiB = 1024**2


# -- helpers ------------------------------------------------------------------


cvs = partial(run_cvs, cwd=REPO, timeout=300)


def write_cluster(
    sandbox: Sandbox,
    directory: Path,
    name: str,
    *,
    hosts: list[str],
    container: dict[str, Any] | None = None,
    host_extra: dict[str, dict[str, Any]] | None = None,
    **top: Any,
) -> Path:
    """The sandbox's cluster file cut down to `hosts`, with container `name`
    (also the cluster name, so labels and lock files are this test's own)."""
    doc = yaml.safe_load(sandbox.cluster_file.read_text())
    doc["name"] = name
    doc["state_dir"] = str(directory / "state")
    doc["hosts"] = [
        {**h, **(host_extra or {}).get(h["name"], {})} for h in doc["hosts"] if h["name"] in hosts
    ]
    # No in-container sshd: these tests are about limits and devices, and it
    # saves a key exchange per host.
    doc["container"].update({"name": name, "sshd": {"enabled": False}, **(container or {})})
    doc.update(top)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def docker(sandbox: Sandbox, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sandbox.docker_argv(host), *args], capture_output=True, text=True, timeout=60
    )


def host_config(sandbox: Sandbox, host: str, name: str) -> dict[str, Any]:
    r = docker(sandbox, host, "inspect", "--type", "container", name)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


def containers_named(sandbox: Sandbox, name: str) -> dict[str, list[str]]:
    """Per sandbox host, the containers (any state) with exactly this name."""
    out = {}
    for h in sandbox.nodes:
        r = docker(sandbox, h.name, "ps", "-a", "--filter", f"name=^{name}$", "--format", "{{.ID}}")
        assert r.returncode == 0, r.stderr
        out[h.name] = r.stdout.split()
    return out


def remove_everywhere(sandbox: Sandbox, name: str) -> None:
    for h in sandbox.nodes:
        docker(sandbox, h.name, "rm", "-f", name)


def exec_stdout(cluster: Path, host: str, *command: str) -> str:
    r = cvs(
        "exec", "--json", "-c", str(cluster), "--hosts", host, "--timeout", "60", "--", *command
    )
    doc = last_json(r)
    assert r.returncode == 0, doc
    return str(doc["hosts"][host]["stdout"])


@pytest.fixture
def container_name(sandbox: Sandbox, request: pytest.FixtureRequest) -> Iterator[str]:
    """A container name of this test's own, removed from every host afterwards."""
    words = re.sub(r"[^a-zA-Z0-9.]+", "-", request.node.name.removeprefix("test_")).strip("-")
    name = f"cvs-res-{words}"[:120]
    remove_everywhere(sandbox, name)
    yield name
    remove_everywhere(sandbox, name)


# -- caps: clamp, docker inspect, cgroup files, per-host caps, status ----------

CAPS_REQUEST = {
    "cpus": 1.5,
    "memory": "256Mi",
    "pids": 64,
    "memory_reservation": "128Mi",
    "cpu_shares": 512,
}


@pytest.fixture(scope="module")
def capped(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """`cvs up` once: node1 under the global cap only, node2 also under a
    tighter per-host cap. Yields the cluster file and the `up` result."""
    name = "cvs-res-caps"
    remove_everywhere(sandbox, name)
    path = write_cluster(
        sandbox,
        tmp_path_factory.mktemp("caps"),
        name,
        hosts=["node1", "node2"],
        container={"resources": CAPS_REQUEST},
        host_extra={"node2": {"limits": {"max_cpus": 0.5, "max_pids": 48}}},
        limits={"max_cpus": 1, "max_memory": "1Gi"},
    )
    try:
        yield path, cvs("up", "-c", str(path))
    finally:
        remove_everywhere(sandbox, name)


def test_up_warns_that_cpus_above_the_cap_are_clamped(
    capped: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, up = capped
    assert up.returncode == 0, up.stderr
    warnings = [line for line in up.stderr.splitlines() if line.startswith("warning:")]
    node1 = [w for w in warnings if "resources.cpus 1.5" in w and "limits.max_cpus 1:" in w]
    assert len(node1) == 1 and "clamped to 1" in node1[0], warnings
    assert "node1" in node1[0] and "node2" not in node1[0]
    # Memory (256Mi) is under its cap (1Gi): no warning about it.
    assert not [w for w in warnings if "memory" in w], warnings


def test_docker_inspect_shows_the_effective_caps(
    sandbox: Sandbox, capped: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    _, up = capped
    assert up.returncode == 0, up.stderr
    hc = host_config(sandbox, "node1", "cvs-res-caps")["HostConfig"]
    assert {k: hc[k] for k in ("NanoCpus", "Memory", "PidsLimit")} == {
        "NanoCpus": 10**9,
        "Memory": 256 * MiB,
        "PidsLimit": 64,
    }
    assert (hc["MemoryReservation"], hc["CpuShares"]) == (128 * MiB, 512)


def test_a_tighter_per_host_cap_wins_on_that_host_only(
    sandbox: Sandbox, capped: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    _, up = capped
    assert up.returncode == 0, up.stderr
    node1 = host_config(sandbox, "node1", "cvs-res-caps")["HostConfig"]
    node2 = host_config(sandbox, "node2", "cvs-res-caps")["HostConfig"]
    assert (node1["NanoCpus"], node1["PidsLimit"]) == (10**9, 64)
    assert (node2["NanoCpus"], node2["PidsLimit"]) == (5 * 10**8, 48)
    assert node1["Memory"] == node2["Memory"] == 256 * MiB
    assert "resources.cpus 1.5 exceeds the cap limits.max_cpus 0.5" in up.stderr
    assert "resources.pids 64 exceeds the cap limits.max_pids 48" in up.stderr


# Reads the container's own cgroup, v2 (unified) or v1 (one dir per controller).
CGROUP_SCRIPT = """\
c=/sys/fs/cgroup
if [ -f $c/cgroup.controllers ]; then
  echo v2; cat $c/cpu.max $c/memory.max $c/pids.max $c/memory.low $c/cpu.weight
else
  echo v1
  cat $c/cpu/cpu.cfs_quota_us $c/cpu/cpu.cfs_period_us $c/memory/memory.limit_in_bytes
  cat $c/pids/pids.max $c/memory/memory.soft_limit_in_bytes $c/cpu/cpu.shares
fi
"""


def test_cgroup_files_inside_the_container_agree_with_the_caps(
    capped: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    path, up = capped
    assert up.returncode == 0, up.stderr
    version, *values = exec_stdout(path, "node1", CGROUP_SCRIPT).splitlines()
    if version == "v2":
        quota_period, memory, pids, low, weight = values
        quota, period = (int(x) for x in quota_period.split())
        assert quota / period == 1.0
        assert (int(memory), int(pids), int(low)) == (256 * MiB, 64, 128 * MiB)
        # runc maps shares 2..262144 onto weight 1..10000.
        assert int(weight) == 1 + (512 - 2) * 9999 // 262142
    else:
        assert version == "v1", values
        quota, period, memory, pids, soft, shares = (int(v) for v in values)
        assert quota / period == 1.0
        assert (memory, pids, soft, shares) == (256 * MiB, 64, 128 * MiB, 512)


def test_status_shows_the_effective_limits_per_host(
    capped: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    path, up = capped
    assert up.returncode == 0, up.stderr
    status = cvs("status", "--json", "-c", str(path))
    assert status.returncode == 0, status.stderr
    rows = last_json(status)["hosts"]
    assert rows["node1"]["limits"] == {
        "cpus": "1",
        "memory": "256Mi",
        "pids": "64",
        "shm_size": "docker default",
        "memory_reservation": "128Mi",
        "cpu_shares": "512",
    }
    assert (rows["node2"]["limits"]["cpus"], rows["node2"]["limits"]["pids"]) == ("0.5", "48")
    assert rows["node1"]["drift"] == rows["node2"]["drift"] == []


# -- a process storm stops at the pids limit ------------------------------------

# Forks `sleep 30` children until the kernel refuses or 100 run, reports the
# count and the cgroup's own pid count at the peak, then kills what it started.
STORM = r"""
my @kids;
my $failed = "";
for (1 .. 100) {
    my $pid = fork;
    if (!defined $pid) { $failed = "$!"; last }
    if ($pid == 0) { exec "sleep", "30"; exit 127 }
    push @kids, $pid;
}
my $current = "?";
for my $f ("/sys/fs/cgroup/pids.current", "/sys/fs/cgroup/pids/pids.current") {
    if (open my $fh, "<", $f) { $current = <$fh>; chomp $current; last }
}
print "started ", scalar(@kids), "\ncurrent $current\nfailed $failed\n";
kill "KILL", @kids;
waitpid($_, 0) for @kids;
"""


def test_a_process_storm_stops_at_the_pids_limit(
    sandbox: Sandbox, tmp_path: Path, container_name: str
) -> None:
    path = write_cluster(
        sandbox, tmp_path, container_name, hosts=["node3"], container={"resources": {"pids": 32}}
    )
    up = cvs("up", "-c", str(path))
    assert up.returncode == 0, up.stderr
    report = dict(
        line.split(" ", 1)
        for line in exec_stdout(path, "node3", "perl", "-e", STORM).splitlines()
        if " " in line
    )
    started, current = int(report["started"]), int(report["current"])
    assert 0 < started < 32, report
    assert current <= 32, report
    assert "Resource temporarily unavailable" in report["failed"], report
    # The storm is over and the container is usable again.
    after = exec_stdout(path, "node3", "sh", "-c", "pgrep -c -f '^sleep 30$' || true")
    assert after.strip() == "0"


# -- persistent containers: limits drift on attach -------------------------------


def test_attaching_to_a_container_with_other_limits_warns_about_drift(
    sandbox: Sandbox, tmp_path: Path, container_name: str
) -> None:
    def cluster(pids: int) -> Path:
        return write_cluster(
            sandbox,
            tmp_path,
            container_name,
            hosts=["node3", "node4"],
            container={"lifetime": "persistent", "resources": {"pids": pids}},
        )

    first = cvs("up", "-c", str(cluster(64)))
    assert first.returncode == 0, first.stderr
    assert "drift" not in first.stderr
    again = cvs("up", "-c", str(cluster(128)))
    assert again.returncode == 0, again.stderr
    drift = [line for line in again.stderr.splitlines() if "limits drift" in line]
    assert len(drift) == 2, again.stderr
    for host, line in zip(["node3", "node4"], sorted(drift), strict=True):
        assert line.startswith("warning:") and host in line
        assert "pids" in line and "64" in line and "128" in line
    # Attached, not replaced: the container still has the limit it started with.
    assert host_config(sandbox, "node3", container_name)["HostConfig"]["PidsLimit"] == 64
    status = last_json(cvs("status", "--json", "-c", str(cluster(128))))
    rows = status["hosts"]
    assert any("PidsLimit" in d for d in rows["node4"]["drift"]), rows["node4"]


# -- GPUs with stand-in device nodes ----------------------------------------------


@pytest.fixture(scope="module")
def gpu_roots() -> Iterator[dict[str, Path]]:
    """node1: eight AMD GPUs. node2: an NVIDIA render node (ignored: not AMD)
    then three AMD GPUs."""
    roots = {
        "node1": make_device_root({m: AMD for m in range(128, 136)}),
        "node2": make_device_root({128: NVIDIA, 129: AMD, 130: AMD, 131: AMD}),
    }
    try:
        yield roots
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


def gpu_cluster(
    sandbox: Sandbox, tmp_path: Path, name: str, roots: dict[str, Path], count: int
) -> Path:
    return write_cluster(
        sandbox,
        tmp_path,
        name,
        hosts=["node1", "node2"],
        container={"gpus": {"count": count}},
        host_extra={h: {"gpu_device_root": str(root)} for h, root in roots.items()},
    )


def test_container_gets_exactly_the_selected_gpu_nodes_and_rocr_numbering(
    sandbox: Sandbox, tmp_path: Path, container_name: str, gpu_roots: dict[str, Path]
) -> None:
    path = gpu_cluster(sandbox, tmp_path, container_name, gpu_roots, count=2)
    up = cvs("up", "-c", str(path))
    assert up.returncode == 0, up.stderr
    expected = {"node1": ["renderD128", "renderD129"], "node2": ["renderD129", "renderD130"]}
    for host, nodes in expected.items():
        info = host_config(sandbox, host, container_name)
        root = gpu_roots[host]
        devices = {(d["PathOnHost"], d["PathInContainer"]) for d in info["HostConfig"]["Devices"]}
        assert devices == {(f"{root}/dev/kfd", "/dev/kfd")} | {
            (f"{root}/dev/dri/{n}", f"/dev/dri/{n}") for n in nodes
        }
        env = [e for e in info["Config"]["Env"] if "VISIBLE_DEVICES" in e]
        assert env == ["ROCR_VISIBLE_DEVICES=0,1"]
        inside = exec_stdout(
            path, host, "sh", "-c", "ls /dev/dri; test -c /dev/kfd && echo kfd; env"
        ).splitlines()
        assert [line for line in inside if line.startswith("renderD")] == nodes
        assert "kfd" in inside
        assert "ROCR_VISIBLE_DEVICES=0,1" in inside
        assert not [line for line in inside if line.startswith("HIP_VISIBLE_DEVICES=")]


def test_unsatisfiable_gpu_request_refuses_before_any_container_starts(
    sandbox: Sandbox, tmp_path: Path, container_name: str, gpu_roots: dict[str, Path]
) -> None:
    path = gpu_cluster(sandbox, tmp_path, container_name, gpu_roots, count=8)
    up = cvs("up", "-c", str(path))
    assert up.returncode == 4, up.stderr
    # node1 has eight and could start; node2 has three and refuses for both.
    refusals = [line for line in up.stderr.splitlines() if "cannot be satisfied" in line]
    assert len(refusals) == 1, up.stderr
    assert "node2" in refusals[0] and "{count: 8}" in refusals[0]
    assert "3 amd GPU(s)" in refusals[0]
    assert containers_named(sandbox, container_name) == {h.name: [] for h in sandbox.nodes}


def test_cdi_always_on_the_sandboxs_docker_is_refused_by_plan_and_up_alike(
    sandbox: Sandbox, tmp_path: Path, container_name: str, gpu_roots: dict[str, Path]
) -> None:
    # The sandbox's docker (20.10) has no CDI: `cvs plan` lists the refusal
    # `up` gives (the plan decides CDI from the probed daemon version), before
    # any image is pulled or container started.
    path = gpu_cluster(sandbox, tmp_path, container_name, gpu_roots, count=1)
    doc = yaml.safe_load(path.read_text())
    doc["container"]["cdi"] = "always"
    path.write_text(yaml.safe_dump(doc))

    plan = cvs("plan", "-c", str(path))
    up = cvs("up", "-c", str(path))

    for proc in (plan, up):
        assert proc.returncode == 4, proc.stderr
        assert "has no CDI (it came in docker 25" in proc.stderr, proc.stderr
        assert proc.stderr.count("has no CDI") == 2, proc.stderr  # node1 and node2
    assert "cvs: refused, nothing was changed" in up.stderr, up.stderr
    assert containers_named(sandbox, container_name) == {h.name: [] for h in sandbox.nodes}


# -- bad values exit 2 naming the key; nothing capped warns ------------------------

BAD_VALUES = [
    ("cpus-0", {"container": {"resources": {"cpus": 0}}}, "container.resources.cpus"),
    ("memory-12XB", {"container": {"resources": {"memory": "12XB"}}}, "container.resources.memory"),
    ("pids-0", {"container": {"resources": {"pids": 0}}}, "container.resources.pids"),
    ("max_cpus--1", {"limits": {"max_cpus": -1}}, "limits.max_cpus"),
    # Loads, but docker refuses it: still exit 2 before any host is touched.
    ("cpus-0.001", {"container": {"resources": {"cpus": 0.001}}}, "container.resources.cpus"),
]


@pytest.mark.parametrize("command", ["validate", "up"])
@pytest.mark.parametrize(
    ("bad", "key"), [(b, k) for _, b, k in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES]
)
def test_bad_resource_values_exit_2_naming_the_key(
    sandbox: Sandbox,
    tmp_path: Path,
    container_name: str,
    command: str,
    bad: dict[str, Any],
    key: str,
) -> None:
    container = bad.get("container", {})
    top = {k: v for k, v in bad.items() if k != "container"}
    path = write_cluster(
        sandbox, tmp_path, container_name, hosts=["node1"], container=container, **top
    )
    result = cvs(command, "-c", str(path))
    assert result.returncode == 2, result.stderr
    assert key in result.stderr
    assert "Traceback" not in result.stderr
    assert containers_named(sandbox, container_name)["node1"] == []


def test_validate_warns_when_nothing_is_capped(sandbox: Sandbox, tmp_path: Path) -> None:
    path = write_cluster(sandbox, tmp_path, "cvs-res-uncapped", hosts=["node1", "node2"])
    result = cvs("validate", "-c", str(path))
    assert result.returncode == 0, result.stderr
    assert "warning: no resource caps: containers may take the whole host" in result.stderr


def test_validate_does_not_warn_once_a_cap_is_set(sandbox: Sandbox, tmp_path: Path) -> None:
    path = write_cluster(
        sandbox, tmp_path, "cvs-res-capped", hosts=["node1"], limits={"max_memory": "8Gi"}
    )
    result = cvs("validate", "-c", str(path))
    assert result.returncode == 0, result.stderr
    assert "no resource caps" not in result.stderr
