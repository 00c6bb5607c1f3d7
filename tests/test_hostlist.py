"""Hostlist expansion: table-driven cases and properties."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from properties import examples

from orchestrator.config.hostlist import (
    MAX_HOSTS,
    HostlistError,
    SelectionError,
    compress_hostlist,
    expand_hostlist,
    select_hosts,
    split_patterns,
)

EXPANSIONS = [
    ("gpu01", ["gpu01"]),
    ("10.1.0.7", ["10.1.0.7"]),
    ("node-a.example.com", ["node-a.example.com"]),
    ("::1", ["::1"]),
    ("gpu[1-3]", ["gpu1", "gpu2", "gpu3"]),
    ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("gpu[1-10]", [f"gpu{i}" for i in range(1, 11)]),
    ("gpu[1-3,7,10-12]", ["gpu1", "gpu2", "gpu3", "gpu7", "gpu10", "gpu11", "gpu12"]),
    ("gpu[5]", ["gpu5"]),
    ("10.1.0.[1-4]", ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("[1-2]x", ["1x", "2x"]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("gpu[3,1]", ["gpu3", "gpu1"]),
]


@pytest.mark.parametrize(("expr", "expected"), EXPANSIONS)
def test_expands_to_expected_hosts_in_order(expr: str, expected: list[str]) -> None:
    assert expand_hostlist(expr) == expected


BAD = [
    ("", "empty host expression"),
    ("gpu[1-3", "unclosed '['"),
    ("gpu1-3]", "unmatched ']'"),
    ("gpu[3-1]", "reversed range"),
    ("gpu[]", "empty brackets"),
    ("gpu[1,,2]", "empty item"),
    ("gpu[a-c]", "bad range 'a-c'"),
    ("gpu[1-2-3]", "bad range"),
    ("gpu[[1-2]]", "nested '['"),
    ("gpu 1", "bad character ' '"),
    ("gpu;rm -rf /", "bad character ';'"),
    ("gpu$(id)", "bad character '$'"),
    ("gpu[1-9999999999]", "more than"),
    ("a[1-300]b[1-300]", "more than"),
]


@pytest.mark.parametrize(("expr", "fragment"), BAD)
def test_bad_expression_raises_one_line_error(expr: str, fragment: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand_hostlist(expr)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_non_string_expression_is_an_error() -> None:
    with pytest.raises(HostlistError, match="must be a string"):
        expand_hostlist(12)  # type: ignore[arg-type]


@given(
    prefix=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
    lo=st.integers(min_value=0, max_value=500),
    span=st.integers(min_value=0, max_value=200),
    width=st.integers(min_value=1, max_value=5),
)
def test_range_has_right_count_and_padding(prefix: str, lo: int, span: int, width: int) -> None:
    hi = lo + span
    lo_text = str(lo).zfill(width)
    hosts = expand_hostlist(f"{prefix}[{lo_text}-{hi}]")
    assert len(hosts) == span + 1
    assert len(set(hosts)) == len(hosts)
    numbers = [h[len(prefix) :] for h in hosts]
    assert [int(n) for n in numbers] == list(range(lo, hi + 1))
    # Padding follows the lower bound's width; wider numbers are not cut.
    assert all(len(n) == max(len(lo_text), len(str(int(n)))) for n in numbers)


@given(
    a=st.integers(min_value=1, max_value=20),
    b=st.integers(min_value=1, max_value=20),
)
def test_two_groups_expand_to_cartesian_product(a: int, b: int) -> None:
    hosts = expand_hostlist(f"r[1-{a}]n[1-{b}]")
    assert len(hosts) == a * b
    assert hosts[0] == "r1n1"
    assert hosts[-1] == f"r{a}n{b}"
    # Leftmost group varies slowest.
    assert hosts[:b] == [f"r1n{j}" for j in range(1, b + 1)]


@given(st.text(max_size=40))
def test_arbitrary_text_expands_or_raises_hostlist_error(text: str) -> None:
    try:
        hosts = expand_hostlist(text)
    except HostlistError:
        return
    assert 1 <= len(hosts) <= MAX_HOSTS


# --- selecting hosts: hostlists first, matched exactly ------------------------

TWELVE = [f"node{i}" for i in range(1, 13)]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("node[10-12]", ["node10", "node11", "node12"]),
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("node[1-3,7],node12", ["node1", "node2", "node3", "node7", "node12"]),
        ("node1", ["node1"]),
        ("node1*", ["node1", "node10", "node11", "node12"]),
        ("node?", [f"node{i}" for i in range(1, 10)]),
        ("node[1-2]*", ["node1", "node2", "node10", "node11", "node12"]),
        ("head", ["node1"]),
        ("head,node[11-12]", ["node1", "node11", "node12"]),
        ("all", TWELVE),
        (None, TWELVE),
        ("node12, node2", ["node2", "node12"]),
    ],
)
def test_selection_expands_hostlists_first_and_matches_exactly(
    pattern: str | None, expected: list[str]
) -> None:
    assert select_hosts(TWELVE, pattern, head="node1") == expected


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("node13", "not a host of the cluster: node13"),
        ("node[11-14]", "node13, node14"),
        ("gpu*", "matches no host"),
        ("node[1-3", "unclosed '['"),
        ("node1,,node2", "empty item"),
        ("node1;id", "bad character ';'"),
        ("node[1-2]\n", "bad character"),
    ],
)
def test_selection_that_does_not_fit_raises_one_line_error(pattern: str, fragment: str) -> None:
    with pytest.raises(SelectionError) as info:
        select_hosts(TWELVE, pattern, head="node1")
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_commas_inside_brackets_do_not_split() -> None:
    assert split_patterns("a[1-3,7],b,c[1,2]") == ["a[1-3,7]", "b", "c[1,2]"]


@st.composite
def clusters_and_hostlists(draw: st.DrawFn) -> tuple[list[str], str, set[str]]:
    """Host names from a few prefixes and padded numbers, and a selection
    written as hostlist expressions, with the set it stands for computed
    independently (format every number of every range)."""
    prefixes = draw(
        st.lists(st.sampled_from(["node", "gpu", "r1n", "n-"]), min_size=1, max_size=3, unique=True)
    )
    width = draw(st.integers(min_value=1, max_value=3))
    top = draw(st.integers(min_value=1, max_value=40))
    names = [f"{p}{str(n).zfill(width)}" for p in prefixes for n in range(1, top + 1)]
    parts: list[str] = []
    wanted: set[str] = set()
    for prefix in draw(st.lists(st.sampled_from(prefixes), min_size=1, max_size=3)):
        items: list[str] = []
        for _ in range(draw(st.integers(min_value=1, max_value=3))):
            lo = draw(st.integers(min_value=1, max_value=top))
            hi = draw(st.integers(min_value=lo, max_value=top))
            lo_text, hi_text = str(lo).zfill(width), str(hi).zfill(width)
            items.append(lo_text if lo == hi else f"{lo_text}-{hi_text}")
            wanted |= {f"{prefix}{str(n).zfill(width)}" for n in range(lo, hi + 1)}
        parts.append(f"{prefix}[{','.join(items)}]")
    return names, ",".join(parts), wanted


@settings(max_examples=examples(300), deadline=None)
@given(case=clusters_and_hostlists())
def test_selection_equals_the_reference_set_in_cluster_order(
    case: tuple[list[str], str, set[str]],
) -> None:
    names, pattern, wanted = case
    assert select_hosts(names, pattern) == [n for n in names if n in wanted]


@settings(max_examples=examples(200), deadline=None)
@given(
    case=clusters_and_hostlists(),
    extra=st.integers(min_value=41, max_value=99),
)
def test_selection_naming_a_host_outside_the_cluster_is_refused(
    case: tuple[list[str], str, set[str]], extra: int
) -> None:
    names, pattern, _ = case
    with pytest.raises(SelectionError, match="not a host of the cluster"):
        select_hosts(names, f"{pattern},node{extra}")


def test_api_and_suite_hosts_use_the_exact_selection() -> None:
    from orchestrator.api import HostSelectionError
    from orchestrator.api import select_hosts as api_select
    from orchestrator.config import parse_cluster
    from orchestrator.suites.model import parse_suite
    from orchestrator.suites.runner import resolve_step_hosts

    cluster = parse_cluster("hosts: ['node[1-12]']\n", "c.yaml", Path("."))
    assert api_select(cluster, "node[10-12]") == ["node10", "node11", "node12"]
    assert api_select(cluster, "node[1-3,7]") == ["node1", "node2", "node3", "node7"]
    with pytest.raises(HostSelectionError, match="node13"):
        api_select(cluster, "node[12-13]")
    suite = parse_suite(
        "name: s\nsteps:\n  - {name: a, run: x, hosts: 'node[10-12]'}\n"
        "  - {name: b, run: x, hosts: 'node[1-3,7]'}\n",
        "s.yaml",
    )
    assert resolve_step_hosts(suite, cluster) == {
        "a": ["node10", "node11", "node12"],
        "b": ["node1", "node2", "node3", "node7"],
    }


# ---- compress_hostlist: the inverse, for group headers and reports -------------------


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([f"node{i:02d}" for i in [*range(1, 13), 14]], "node[01-12,14]"),
        (["node1", "node2", "node3", "gpu07"], "gpu07,node[1-3]"),
        (["r1n01", "r1n02", "r2n01", "r2n02"], "r[1-2]n[01-02]"),
        (["n9", "n10"], "n[9-10]"),
        (["login"], "login"),
        (["a1"], "a1"),
        (["node3", "node1", "node2"], "node[1-3]"),
    ],
)
def test_compress_hostlist_writes_ranges_like_clush(names: list[str], expected: str) -> None:
    assert compress_hostlist(names) == expected


@given(
    st.lists(
        st.tuples(st.sampled_from(["node", "gpu", "r1n"]), st.integers(0, 120), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_compress_then_expand_gives_the_same_hosts(spec: list[tuple[str, int, bool]]) -> None:
    names = list(dict.fromkeys(f"{p}{n:03d}" if pad else f"{p}{n}" for p, n, pad in spec))
    expanded: list[str] = []
    for part in split_patterns(compress_hostlist(names)):
        expanded.extend(expand_hostlist(part))
    assert sorted(expanded) == sorted(names)


@settings(max_examples=examples(200), deadline=None)
@given(case=clusters_and_hostlists(), prefix=st.sampled_from(["node", "gpu", "r1n", "n-", "no"]))
def test_a_glob_part_selects_what_fnmatch_selects(
    case: tuple[list[str], str, set[str]], prefix: str
) -> None:
    import fnmatch

    names, _, _ = case
    reference = [n for n in names if fnmatch.fnmatchcase(n, f"{prefix}*")]
    if reference:
        assert select_hosts(names, f"{prefix}*") == reference
    else:
        with pytest.raises(SelectionError, match="matches no host"):
            select_hosts(names, f"{prefix}*")
