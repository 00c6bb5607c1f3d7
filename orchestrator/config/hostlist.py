"""Hostlist expressions, as Slurm and pdsh write them.

`gpu[001-016]` is sixteen hosts, `gpu[1-3,7]` four, `10.1.0.[1-4]` four
addresses, and `r[1-2]n[01-02]` the cartesian product in order (r1n01, r1n02,
r2n01, r2n02). Zero padding follows the width of a range's lower bound, the
way Slurm does it: `[01-10]` gives 01..10, `[1-10]` gives 1..10.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Iterable

# An expression this large is almost certainly a typo (`gpu[1-100000]`), and
# expanding it would only burn memory before the duplicate/host checks fail.
MAX_HOSTS = 65536

_PLAIN_CHARS = re.compile(r"[A-Za-z0-9_.:-]")
_GLOB_CHARS = frozenset("*?")
_ITEM_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


class HostlistError(ValueError):
    """A hostlist expression cannot be expanded. `str()` is one line."""


def _expand_group(expr: str, body: str, start: int) -> list[str]:
    if not body:
        raise HostlistError(f"empty brackets at position {start} in {expr!r}")
    out: list[str] = []
    for item in body.split(","):
        m = _ITEM_RE.fullmatch(item)
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


def _segments(expr: str, extra: frozenset[str] = frozenset()) -> list[list[str]]:
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
        if not _PLAIN_CHARS.fullmatch(ch) and ch not in extra:
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


# ---- selecting hosts --------------------------------------------------------


class SelectionError(ValueError):
    """A host selection pattern is malformed or names hosts the cluster lacks."""


def split_patterns(pattern: str) -> list[str]:
    """Split on the commas outside brackets: `node[1-3,7],gpu*` -> [`node[1-3,7]`, `gpu*`]."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in pattern:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip(" ") for p in parts]


def _expand_glob_part(part: str) -> list[str]:
    """A glob (`*`, `?`) whose brackets are hostlist ranges: `r[1-2]n*` -> [`r1n*`, `r2n*`].

    The brackets are expanded as a hostlist first, so they never act as a
    shell character class (`node[10-12]*` is node10*, node11*, node12*).
    """
    segments = _segments(part, extra=_GLOB_CHARS)
    return ["".join(p) for p in itertools.product(*segments)]


def select_hosts(names: list[str], pattern: str | None, *, head: str | None = None) -> list[str]:
    """The hosts of `names` a selection pattern picks, in cluster order.

    `pattern` is comma-separated (commas inside brackets do not split). Each
    part is `head`, `all`, an exact name, a hostlist expression (expanded
    first, then matched exactly: `node[10-12]` is node10, node11, node12 and
    nothing else), or, only when it holds `*` or `?`, a shell glob (its
    brackets still hostlist ranges). A name a hostlist or exact part gives
    that is not in the cluster is an error: commands never run on hosts the
    user did not mean. None, "" or `all` select every host.
    """
    if pattern is None or pattern.strip(" ") in ("", "all"):
        return list(names)
    known = set(names)
    chosen: set[str] = set()
    for part in split_patterns(pattern):
        if not part:
            raise SelectionError(f"{pattern!r}: empty item between commas")
        if part == "all":
            chosen.update(names)
            continue
        if part == "head":
            if head is None:
                raise SelectionError(f"{pattern!r}: 'head' but the cluster names no head")
            chosen.add(head)
            continue
        try:
            if _GLOB_CHARS & set(part):
                globs = _expand_glob_part(part)
                matched = {n for n in names for g in globs if fnmatch.fnmatchcase(n, g)}
                if not matched:
                    raise SelectionError(f"{part!r} matches no host")
            else:
                expanded = expand_hostlist(part)
                missing = [n for n in expanded if n not in known]
                if missing:
                    shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
                    raise SelectionError(f"{part!r}: not a host of the cluster: {shown}")
                matched = set(expanded)
        except (HostlistError, ValueError) as exc:
            if isinstance(exc, SelectionError):
                raise
            raise SelectionError(f"{part!r}: {exc}") from None
        chosen.update(matched)
    return [n for n in names if n in chosen]


# ---- the inverse: names -> a compact hostlist ----------------------------------


def compress_hostlist(hosts: Iterable[str]) -> str:
    """`node01`..`node12`, `node14` -> `node[01-12,14]`: the inverse of `expand_hostlist`,
    for group headers and reports.

    Folded by ClusterShell's NodeSet (the library behind clush and nodeset), sorted,
    padding kept, several dimensions folded (`r[1-2]n[01-02]`); `expand_hostlist`
    reads what it writes (a property test checks the round trip). No node groups:
    names are taken literally.
    """
    names = list(hosts)
    if not names:
        return ""
    # ClusterShell (about 30 ms) only when a list is folded for display: a
    # `cvs exec` whose hosts all succeed never loads it.
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet  # type: ignore[import-untyped]

    return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))
