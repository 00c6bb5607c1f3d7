"""What the user's ssh config (~/.ssh/config) says about reaching a host.

asyncssh parses the whole file for every host it is asked about (a Python
tokenizer per line: 11 ms for a 300-block config here), and cvs asks twice
per host, for the known_hosts files strict checking reads and for the route
(a `ProxyJump` to share, the sshd a handshake costs). So the answer is
computed once per host and file version and kept (`config_options`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

from orchestrator.ssh.libsearch import asyncssh


def default_config_path() -> Path:
    """~/.ssh/config, with HOME as it is now."""
    return Path("~/.ssh/config").expanduser()


def config_options(
    host: str, port: int, username: str | None = None, *, config: Path | None = None
) -> asyncssh.SSHClientConnectionOptions | None:
    """asyncssh's reading of `config` (default ~/.ssh/config) for this host,
    without loading any key; None when there is no such file or it cannot be
    read (asyncssh reports that at connect time, naming the host)."""
    path = config or default_config_path()
    try:
        version = path.stat().st_mtime_ns
    except OSError:
        return None
    if not path.is_file():
        return None
    return _parsed(host, port, username, str(path), version)


@functools.lru_cache(maxsize=4096)
def _parsed(
    host: str, port: int, username: str | None, path: str, version: int
) -> asyncssh.SSHClientConnectionOptions | None:
    del version  # part of the cache key only: an edited file is read again
    try:
        return asyncssh.SSHClientConnectionOptions(
            host=host, port=port, username=username or (), config=[path], client_keys=None
        )
    except (OSError, ValueError, asyncssh.Error):
        return None


class ConfigRoute(NamedTuple):
    """How the ssh config routes a connection to an address."""

    host: str  # the HostName an alias stands for, else the address
    jump: str | None = None  # its ProxyJump, as asyncssh takes it ("[user@]host[:port],...")
    proxy_command: bool = False


def config_route(
    address: str, port: int, username: str | None = None, *, config: Path | None = None
) -> ConfigRoute:
    """What the ssh config says about reaching `address`."""
    options = config_options(address, port, username, config=config)
    if options is None:
        return ConfigRoute(address)
    jump = options.tunnel if isinstance(options.tunnel, str) and options.tunnel else None
    return ConfigRoute(str(options.host or address), jump, bool(options.proxy_command))


def sshd_key(
    address: str, port: int, username: str | None = None, *, config: Path | None = None
) -> str:
    """The sshd a direct handshake to `address` costs, as far as the ssh config
    says: the `HostName` an alias stands for, else the address itself (host
    entries that share an address share its sshd: aliases, a gateway
    forwarding ports). Any `ProxyCommand`: where it leads is not ours to
    parse, so all share one key. (A `ProxyJump` costs its bastion one
    handshake, shared by the hosts behind it: see `SSHPool._jump_route`.)"""
    route = config_route(address, port, username, config=config)
    return "proxy-command" if route.proxy_command else route.host
