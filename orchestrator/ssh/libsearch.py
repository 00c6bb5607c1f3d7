"""asyncssh, imported without spawning a process.

asyncssh's import looks for optional C libraries (liboqs for its
post-quantum key exchanges, libnettle for UMAC) with
`ctypes.util.find_library`, which on Linux runs `ldconfig -p`, and for a
library that is not there `gcc` and `ld` too: five to seven processes at
every start of a command that connects (12-20 ms idle on the 2-core machine,
far more under load). The answer is in the dynamic linker's cache, a file:
`find_library` here reads `/etc/ld.so.cache` with the rule CPython applies
to `ldconfig -p`'s output (the first `libNAME.` entry of this machine's ABI)
and, for a library found nowhere in it, looks in `LD_LIBRARY_PATH`'s
directories (what CPython's `ld` fallback searches). Where the cache cannot
be read (not glibc, another format, another machine type), the standard
`find_library` answers.

`from orchestrator.ssh.libsearch import asyncssh` imports asyncssh with it;
every module of this package that needs asyncssh imports it from here, and
only those that connect import them: `cvs --help`, `cvs validate` and the
other commands that do not connect never import asyncssh.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import platform
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

CACHE = Path("/etc/ld.so.cache")
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_MAGIC = b"ld.so-1.7.0"
# The entry flags `ldconfig -p` prints as CPython's ABI words for this
# machine (`libc6,x86-64` ...): FLAG_ELF_LIBC6 with the machine's lib64 flag.
_ABI_FLAGS = {"x86_64": 0x0303, "aarch64": 0x0A03, "ppc64le": 0x0503, "s390x": 0x0603}


def _cache_entries(data: bytes) -> Iterator[tuple[int, str, str]]:
    """(flags, soname, path) of every entry of an ld.so.cache, in its order."""
    start = 0
    if data.startswith(_OLD_MAGIC):
        # The old format first, then the new one (8-aligned): read the new.
        (old_count,) = struct.unpack_from("=I", data, 12)
        start = (16 + old_count * 12 + 7) & ~7
    if data[start : start + len(_NEW_MAGIC)] != _NEW_MAGIC:
        raise ValueError("not a glibc ld.so.cache (format 1.1)")
    (count,) = struct.unpack_from("=I", data, start + 20)
    for i in range(count):
        flags, key, value, _os, _hwcap = struct.unpack_from("=iIIIQ", data, start + 48 + 24 * i)
        yield flags, _string(data, start + key), _string(data, start + value)


def _string(data: bytes, offset: int) -> str:
    return os.fsdecode(data[offset : data.index(b"\0", offset)])


@functools.cache
def _sonames() -> tuple[tuple[str, str], ...] | None:
    """(soname, path) of this machine's ABI from the linker's cache, or None
    when it cannot be read (then the standard search answers)."""
    flags = _ABI_FLAGS.get(platform.machine())
    if flags is None or not sys.platform.startswith("linux"):
        return None
    try:
        data = CACHE.read_bytes()
        return tuple((k, v) for f, k, v in _cache_entries(data) if f == flags)
    except (OSError, ValueError, struct.error):
        return None


def find_library(name: str) -> str | None:
    """What `ctypes.util.find_library(name)` answers, from the linker's cache
    file instead of `ldconfig -p`, `gcc` and `ld` processes."""
    entries = _sonames()
    if entries is None:
        return ctypes.util.find_library(name)
    prefix = f"lib{name}."
    for soname, _path in entries:
        if soname.startswith(prefix):
            return soname
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if directory:
            found = sorted(Path(directory).glob(f"lib{name}.so*"))
            if found:
                return str(found[0])
    return None


def _import_asyncssh() -> None:
    if "asyncssh" in sys.modules:
        return
    standard = ctypes.util.find_library
    ctypes.util.find_library = find_library
    try:
        import asyncssh  # noqa: F401
    finally:
        ctypes.util.find_library = standard


_import_asyncssh()

import asyncssh as asyncssh  # noqa: E402  (the import above, already done)

__all__ = ["asyncssh", "find_library"]
