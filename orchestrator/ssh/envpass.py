"""Environment values sent over a command's standard input, never in its argv.

Anything in a command line is visible to every user of the host (`ps`,
/proc/PID/cmdline). So a command that needs `env` starts with a reader
(`env_reader(token)`, POSIX sh, builtins only) and its stdin begins with
`env_block(env, token)`: one `export K='V'` per variable, then the token on a
line of its own. The reader evaluates what came before the token; the rest of
stdin is the command's.

`sh` reads a pipe one byte at a time for `read`, so it never consumes input
past the token line. The token is random per command, so no value can end the
block early.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TOKEN = re.compile(r"[0-9a-f]{16,64}")


def new_token() -> str:
    return secrets.token_hex(12)


def env_reader(token: str) -> str:
    """Shell text that reads the env block from stdin and exports it."""
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"invalid env token {token!r}")
    # Values are shell-quoted, so a value with newlines spans lines: keep the
    # newlines while collecting, evaluate once at the token.
    return (
        "__cvs_e=; while IFS= read -r __cvs_l; do "
        f'[ "$__cvs_l" = {token} ] && break; '
        '__cvs_e="$__cvs_e$__cvs_l\n"; done; '
        'eval "$__cvs_e"; unset __cvs_e __cvs_l; '
    )


def env_block(env: Mapping[str, str], token: str) -> str:
    """The stdin prefix that `env_reader(token)` consumes."""
    lines = []
    for key, value in env.items():
        if not _NAME.fullmatch(key):
            raise ValueError(f"invalid environment variable name {key!r}")
        lines.append(f"export {key}={shlex.quote(value)}\n")
    return "".join(lines) + token + "\n"
