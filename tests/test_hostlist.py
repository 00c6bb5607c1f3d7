"""Hostlist expansion: table-driven cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.config.hostlist import MAX_HOSTS, HostlistError, expand_hostlist

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
