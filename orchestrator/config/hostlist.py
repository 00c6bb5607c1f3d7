"""Hostlist expressions, as Slurm and pdsh write them.

`gpu[001-016]` is sixteen hosts, `gpu[1-3,7]` four, `10.1.0.[1-4]` four
addresses, and `r[1-2]n[01-02]` the cartesian product in order (r1n01, r1n02,
r2n01, r2n02). Zero padding follows the width of a range's lower bound, the
way Slurm does it: `[01-10]` gives 01..10, `[1-10]` gives 1..10.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

# An expression this large is almost certainly a typo (`gpu[1-100000]`), and
# expanding it would only burn memory before the duplicate/host checks fail.
MAX_HOSTS = 65536

_PLAIN_CHARS = re.compile(r"[A-Za-z0-9_.:-]")
_ITEM_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    """A hostlist expression cannot be expanded. `str()` is one line."""


def _expand_group(expr: str, body: str, start: int) -> list[str]:
    if not body:
        raise HostlistError(f"empty brackets at position {start} in {expr!r}")
    out: list[str] = []
    for item in body.split(","):
        m = _ITEM_RE.match(item)
        if not m:
            what = "empty item" if not item else f"bad range {item!r}"
            raise HostlistError(
                f"{what} in {expr!r} (expected numbers or ranges like 1-3,7 inside [...])"
            )
        lo_text, hi_text = m.group(1), m.group(2)
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if hi < lo:
            raise HostlistError(f"reversed range {item!r} in {expr!r} ({lo} > {hi})")
        if len(out) + (hi - lo + 1) > MAX_HOSTS:
            raise HostlistError(f"{expr!r} expands to more than {MAX_HOSTS} hosts")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _segments(expr: str) -> list[list[str]]:
    """Split `expr` into literal parts and bracket groups, each a list of choices."""
    segments: list[list[str]] = []
    literal: list[str] = []
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "[":
            close = expr.find("]", i + 1)
            nested = expr.find("[", i + 1)
            if close == -1:
                raise HostlistError(f"unclosed '[' at position {i} in {expr!r}")
            if nested != -1 and nested < close:
                raise HostlistError(f"nested '[' at position {nested} in {expr!r}")
            if literal:
                segments.append(["".join(literal)])
                literal = []
            segments.append(_expand_group(expr, expr[i + 1 : close], i))
            i = close + 1
            continue
        if ch == "]":
            raise HostlistError(f"unmatched ']' at position {i} in {expr!r}")
        if not _PLAIN_CHARS.match(ch):
            raise HostlistError(f"bad character {ch!r} at position {i} in {expr!r}")
        literal.append(ch)
        i += 1
    if literal:
        segments.append(["".join(literal)])
    return segments


def expand_hostlist(expr: str) -> list[str]:
    """All host names `expr` stands for, in order. Raises HostlistError."""
    if not isinstance(expr, str):
        raise HostlistError(f"host expression must be a string, got {type(expr).__name__}")
    if not expr:
        raise HostlistError("empty host expression")
    segments = _segments(expr)
    total = 1
    for choices in segments:
        total *= len(choices)
        if total > MAX_HOSTS:
            raise HostlistError(f"{expr!r} expands to more than {MAX_HOSTS} hosts")
    return ["".join(parts) for parts in itertools.product(*segments)]


# How many host names a message spells out before "and N more".
MAX_NAMED_HOSTS = 12


def abbreviate_hosts(hosts: Iterable[str], limit: int = MAX_NAMED_HOSTS) -> str:
    """`h1, h2, h3` or, past `limit` names, `h1, ..., h12 and 188 more`: host
    names in messages, so a refusal on 500 hosts stays one readable line."""
    names = list(hosts)
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"
