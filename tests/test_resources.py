"""Resource clamps: min(request, tightest cap), docker flags, inspect values, drift."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from orchestrator.config import (
    ClusterConfig,
    ContainerConfig,
    HostSpec,
    Limits,
    Resources,
    uncapped_hosts,
)
from orchestrator.limits.resources import (
    DOCKER_DEFAULT_SHM_BYTES,
    EffectiveResources,
    ResourceError,
    cluster_effective_resources,
    effective_resources,
    limits_drift,
)

GI = 1024**3
MI = 1024**2

# (request field, cap field, EffectiveResources attribute, request, cap, expected, warns)
CLAMP_CASES = [
    ("cpus", "max_cpus", "cpus", 2.0, 8.0, 2.0, False),
    ("cpus", "max_cpus", "cpus", 16.0, 8.0, 8.0, True),
    ("cpus", "max_cpus", "cpus", 8.0, 8.0, 8.0, False),
    ("cpus", "max_cpus", "cpus", 1.5, None, 1.5, False),
    ("cpus", "max_cpus", "cpus", None, 4.0, 4.0, False),
    ("cpus", "max_cpus", "cpus", None, None, None, False),
    ("memory", "max_memory", "memory_bytes", "4Gi", "16G", 4 * GI, False),
    ("memory", "max_memory", "memory_bytes", "64g", "16G", 16 * GI, True),
    ("memory", "max_memory", "memory_bytes", "16Gi", "16g", 16 * GI, False),
    ("memory", "max_memory", "memory_bytes", "1.5g", None, int(1.5 * GI), False),
    ("memory", "max_memory", "memory_bytes", None, "512Mi", 512 * MI, False),
    ("memory", "max_memory", "memory_bytes", None, None, None, False),
    ("pids", "max_pids", "pids", 100, 4096, 100, False),
    ("pids", "max_pids", "pids", 10000, 4096, 4096, True),
    ("pids", "max_pids", "pids", 4096, 4096, 4096, False),
    ("pids", "max_pids", "pids", 64, None, 64, False),
    ("pids", "max_pids", "pids", None, 4096, 4096, False),
    ("pids", "max_pids", "pids", None, None, None, False),
]


@pytest.mark.parametrize(
    ("key", "cap_key", "attr", "request_value", "cap_value", "expected", "warns"), CLAMP_CASES
)
def test_effective_value_is_min_of_request_and_cap(
    key, cap_key, attr, request_value, cap_value, expected, warns
):
    eff = effective_resources(Resources(**{key: request_value}), Limits(**{cap_key: cap_value}))
    assert getattr(eff, attr) == expected
    if warns:
        (warning,) = eff.warnings
        assert f"resources.{key}" in warning
        assert f"limits.{cap_key}" in warning
    else:
        assert eff.warnings == ()


def test_clamp_warning_names_request_and_cap_values():
    eff = effective_resources(
        Resources(memory="64g", cpus=16), Limits(max_memory="16G", max_cpus=8)
    )
    assert eff.warnings == (
        "resources.cpus 16 exceeds the cap limits.max_cpus 8: clamped to 8",
        "resources.memory 64Gi exceeds the cap limits.max_memory 16Gi: clamped to 16Gi",
    )


@pytest.mark.parametrize(
    ("global_cap", "host_cap", "expected_cpus"),
    [
        (Limits(max_cpus=8), Limits(max_cpus=4), 4.0),
        (Limits(max_cpus=4), Limits(max_cpus=8), 4.0),
        (Limits(max_cpus=8), None, 8.0),
        (None, Limits(max_cpus=2), 2.0),
        (Limits(max_memory="1G"), Limits(max_cpus=2), 2.0),
        (None, None, None),
    ],
)
def test_tighter_of_global_and_host_cap_wins(global_cap, host_cap, expected_cpus):
    assert effective_resources(Resources(), global_cap, host_cap).cpus == expected_cpus


def test_global_and_host_caps_on_different_keys_both_apply():
    eff = effective_resources(Resources(), Limits(max_memory="8G"), Limits(max_pids=100))
    assert (eff.memory_bytes, eff.pids, eff.cpus) == (8 * GI, 100, None)


def test_soft_and_shm_values_pass_through_unclamped():
    eff = effective_resources(
        Resources(shm_size="2g", memory_reservation="1g", cpu_shares=512),
        Limits(max_cpus=1, max_memory="4g", max_pids=10),
    )
    assert (eff.shm_size_bytes, eff.memory_reservation_bytes, eff.cpu_shares) == (
        2 * GI,
        GI,
        512,
    )


def test_reservation_above_capped_memory_is_clamped_to_memory_with_warning():
    eff = effective_resources(
        Resources(memory="8g", memory_reservation="6g"), Limits(max_memory="4g")
    )
    assert eff.memory_bytes == 4 * GI
    assert eff.memory_reservation_bytes == 4 * GI
    assert any("memory_reservation 6Gi" in w and "clamped to 4Gi" in w for w in eff.warnings)


def test_reservation_without_memory_limit_stands():
    eff = effective_resources(Resources(memory_reservation="6g"))
    assert eff.memory_reservation_bytes == 6 * GI
    assert eff.warnings == ()


# ------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("model", "data", "key"),
    [
        (Resources, {"cpus": 0}, "cpus"),
        (Resources, {"cpus": -1}, "cpus"),
        (Resources, {"pids": 0}, "pids"),
        (Resources, {"cpu_shares": 1}, "cpu_shares"),
        (Limits, {"max_cpus": 0}, "max_cpus"),
        (Limits, {"max_cpus": -1}, "max_cpus"),
        (Limits, {"max_pids": 0}, "max_pids"),
        (Resources, {"memory": "12XB"}, "memory"),
        (Resources, {"shm_size": "lots"}, "shm_size"),
        (Resources, {"memory_reservation": "-1g"}, "memory_reservation"),
        (Limits, {"max_memory": "12XB"}, "max_memory"),
    ],
)
def test_bad_number_is_a_validation_error_naming_the_key(model, data, key):
    with pytest.raises(ValidationError) as info:
        model(**data)
    assert info.value.errors()[0]["loc"] == (key,)


@pytest.mark.parametrize(
    ("request_", "cap", "key"),
    [
        # model_construct skips validation, as a caller building models by hand might.
        (Resources.model_construct(memory="12XB"), None, "resources.memory"),
        (Resources(), Limits.model_construct(max_memory="12XB"), "limits.max_memory"),
        (Resources(memory="1Mi"), None, "resources.memory"),
        (Resources(), Limits(max_memory="1k"), "limits.max_memory"),
        (Resources(cpus=0.001), None, "resources.cpus"),
        (Resources(), Limits(max_cpus=0.001), "limits.max_cpus"),
    ],
)
def test_unparsable_size_or_value_docker_refuses_names_the_key(request_, cap, key):
    with pytest.raises(ResourceError, match=rf"^{key}: "):
        effective_resources(request_, cap)


# ------------------------------------------------------------------- properties

cpus_st = st.none() | st.floats(min_value=0.01, max_value=512, allow_nan=False).map(
    lambda c: round(c, 3)
)
memory_st = st.none() | st.integers(min_value=6 * MI, max_value=2**40)
pids_st = st.none() | st.integers(min_value=1, max_value=10**6)


def _limits(cpus, memory, pids):
    return Limits(max_cpus=cpus, max_memory=None if memory is None else str(memory), max_pids=pids)


@given(cpus_st, memory_st, pids_st, cpus_st, memory_st, pids_st)
def test_effective_never_exceeds_cap_and_equals_request_within_cap(rc, rm, rp, cc, cm, cp):
    eff = effective_resources(
        Resources(cpus=rc, memory=None if rm is None else str(rm), pids=rp), _limits(cc, cm, cp)
    )
    for request, cap, value in ((rc, cc, eff.cpus), (rm, cm, eff.memory_bytes), (rp, cp, eff.pids)):
        if cap is not None:
            assert value is not None
            assert value <= cap
        if request is not None and (cap is None or request <= cap):
            assert value == request
        if request is None and cap is None:
            assert value is None


@given(cpus_st, cpus_st, cpus_st)
def test_order_of_caps_does_not_matter(request, a, b):
    first = effective_resources(Resources(cpus=request), Limits(max_cpus=a), Limits(max_cpus=b))
    second = effective_resources(Resources(cpus=request), Limits(max_cpus=b), Limits(max_cpus=a))
    assert first.cpus == second.cpus


# ---------------------------------------------------------------- docker output


def test_docker_args_carry_every_set_key_in_bytes_and_exact_cpus():
    eff = effective_resources(
        Resources(
            cpus=1.5,
            memory="16G",
            pids=4096,
            shm_size="1g",
            memory_reservation="8g",
            cpu_shares=512,
        )
    )
    assert eff.docker_args() == [
        "--cpus", "1.5",
        "--memory", str(16 * GI),
        "--pids-limit", "4096",
        "--shm-size", str(GI),
        "--memory-reservation", str(8 * GI),
        "--cpu-shares", "512",
    ]  # fmt: skip


def test_unbounded_resources_give_no_run_args():
    assert EffectiveResources().docker_args() == []


def test_as_inspect_matches_docker_host_config_units():
    eff = effective_resources(
        Resources(cpus=0.25, memory="512Mi", pids=64, memory_reservation="256Mi", cpu_shares=100)
    )
    assert eff.as_inspect() == {
        "NanoCpus": 250_000_000,
        "Memory": 512 * MI,
        "PidsLimit": 64,
        "MemoryReservation": 256 * MI,
        "CpuShares": 100,
        "ShmSize": DOCKER_DEFAULT_SHM_BYTES,
    }


def test_as_inspect_of_unbounded_is_docker_defaults():
    assert EffectiveResources().as_inspect() == {
        "NanoCpus": 0,
        "Memory": 0,
        "PidsLimit": None,
        "MemoryReservation": 0,
        "CpuShares": 0,
        "ShmSize": DOCKER_DEFAULT_SHM_BYTES,
    }


def test_no_drift_when_container_matches_config():
    eff = effective_resources(Resources(cpus=2, memory="4g", pids=100))
    assert limits_drift(eff, eff.as_inspect()) == []


@pytest.mark.parametrize("unset_pids", [None, 0, -1])
def test_unset_pids_limit_in_any_docker_spelling_is_not_drift(unset_pids):
    host_config = EffectiveResources().as_inspect() | {"PidsLimit": unset_pids}
    assert limits_drift(EffectiveResources(), host_config) == []


def test_drift_gives_one_message_per_differing_key():
    eff = effective_resources(Resources(cpus=2, memory="4g", pids=100))
    running = eff.as_inspect() | {"Memory": 8 * GI, "PidsLimit": None}
    assert limits_drift(eff, running) == [
        "memory (Memory): the container has 8Gi, the config asks for 4Gi",
        "pids (PidsLimit): the container has unlimited, the config asks for 100",
    ]


def test_drift_reports_a_limit_the_config_no_longer_sets():
    running = EffectiveResources().as_inspect() | {"NanoCpus": 4 * 10**9}
    assert limits_drift(EffectiveResources(), running) == [
        "cpus (NanoCpus): the container has 4, the config asks for unlimited"
    ]


# ---------------------------------------------------------------- cluster level


def _cluster(**kw) -> ClusterConfig:
    hosts = kw.pop("hosts", [HostSpec(name="a"), HostSpec(name="b")])
    container = ContainerConfig(image="img", resources=kw.pop("resources", Resources()))
    return ClusterConfig(hosts=hosts, container=container, **kw)


def test_cluster_without_caps_or_requests_is_uncapped():
    assert uncapped_hosts(_cluster()) == ["a", "b"]


def test_cluster_with_a_global_cap_is_not_uncapped():
    assert not uncapped_hosts(_cluster(limits=Limits(max_memory="64g")))


def test_cluster_with_one_host_left_unbounded_is_uncapped():
    hosts = [HostSpec(name="a", limits=Limits(max_pids=10)), HostSpec(name="b")]
    assert uncapped_hosts(_cluster(hosts=hosts)) == ["b"]


def test_cluster_whose_request_bounds_everything_is_not_uncapped():
    assert not uncapped_hosts(_cluster(resources=Resources(cpus=1)))


def test_cluster_without_container_is_not_uncapped():
    assert not uncapped_hosts(ClusterConfig(hosts=[HostSpec(name="a")]))


def test_per_host_caps_give_per_host_effective_resources():
    hosts = [HostSpec(name="a", limits=Limits(max_cpus=2)), HostSpec(name="b")]
    eff = cluster_effective_resources(
        _cluster(hosts=hosts, limits=Limits(max_cpus=8), resources=Resources(cpus=4))
    )
    assert (eff["a"].cpus, eff["b"].cpus) == (2.0, 4.0)
    assert len(eff["a"].warnings) == 1 and eff["b"].warnings == ()


def test_bad_per_host_cap_names_the_host():
    hosts = [HostSpec(name="a"), HostSpec(name="gpu7", limits=Limits(max_memory="1k"))]
    with pytest.raises(ResourceError, match=r"^hosts\[gpu7\]\.limits\.max_memory: "):
        cluster_effective_resources(_cluster(hosts=hosts))


def test_bad_request_names_the_container_key():
    with pytest.raises(ResourceError, match=r"^container\.resources\.memory: "):
        cluster_effective_resources(_cluster(resources=Resources(memory="1Mi")))


def test_legacy_container_shm_size_feeds_the_effective_value():
    cluster = _cluster()
    cluster = cluster.model_copy(
        update={"container": cluster.container.model_copy(update={"shm_size": "2g"})}
    )
    assert cluster_effective_resources(cluster)["a"].shm_size_bytes == 2 * GI


def test_conflicting_shm_sizes_are_an_error():
    cluster = _cluster(resources=Resources(shm_size="1g"))
    cluster = cluster.model_copy(
        update={"container": cluster.container.model_copy(update={"shm_size": "2g"})}
    )
    with pytest.raises(ResourceError, match="disagree"):
        cluster_effective_resources(cluster)
