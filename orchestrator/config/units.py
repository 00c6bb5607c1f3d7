"""Sizes with units, as operators write them (`512Mi`, `16G`, `1.5g`)."""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str | int) -> int:
    """Bytes in `text`.

    Docker's convention is followed: `g`, `G`, `Gi`, `GiB` and `GB` are all
    binary (1024**3) — that is what `docker run --memory 16g` means, and a
    cluster file that says `16G` expects the same container as one that says
    `16g`. A bare number is bytes.
    """
    if isinstance(text, bool):
        raise ValueError(f"invalid size {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"invalid size {text!r}: negative")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"invalid size {text!r} (expected e.g. 512Mi, 16G, 1.5g)")
    number, unit, _, _ = m.groups()
    value = float(number) * 1024 ** _POWERS[unit.lower()]
    if value < 1:
        raise ValueError(f"invalid size {text!r}: must be at least 1 byte")
    return int(value)


def format_size(n: int) -> str:
    """Short human form in the largest unit that fits: exact when it divides
    (`16Gi`, `1.5Gi`), else rounded to one decimal (`23.5Gi` for a host's
    24684092Ki of RAM); a size never reads as a six-digit count of Ki."""
    for unit, power in (("Pi", 5), ("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1)):
        div = 1024**power
        if n >= div:
            if n % div == 0:
                return f"{n // div}{unit}"
            if (n * 10) % div == 0:
                return f"{n * 10 // div / 10:g}{unit}"
            return f"{n / div:.1f}{unit}"
    return f"{n}B"
