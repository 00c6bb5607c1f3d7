"""Reading the user's ssh config: once per host, and for routing only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from orchestrator.ssh import sshconfig
from orchestrator.ssh.keys import strict_known_hosts
from orchestrator.ssh.sshconfig import ConfigRoute, config_route, sshd_key


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hosts asyncssh was asked to read the ssh config for, by cvs."""
    calls: list[str] = []
    real = asyncssh.SSHClientConnectionOptions

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["host"])
        return real(*args, **kwargs)

    sshconfig._parsed.cache_clear()
    monkeypatch.setattr(asyncssh, "SSHClientConnectionOptions", counting)
    return calls


def test_the_ssh_config_is_read_once_per_host_until_it_changes(
    tmp_path: Path, parses: list[str]
) -> None:
    (tmp_path / ".ssh").mkdir()
    config = tmp_path / ".ssh" / "config"
    known = tmp_path / "kh"
    known.write_text("")
    config.write_text(f"Host gpu1\n  HostName 10.1.1.1\n  UserKnownHostsFile {known}\n")
    assert config_route("gpu1", 22, config=config).host == "10.1.1.1"
    assert sshd_key("gpu1", 22, config=config) == "10.1.1.1"
    # Strict checking asks the same file which known_hosts to read.
    strict = strict_known_hosts(
        configured=None, use_ssh_config=True, host="gpu1", port=22, home=tmp_path
    )
    assert strict.known_hosts == [str(known)]
    assert parses == ["gpu1"]
    config.write_text("Host gpu1\n  HostName 10.2.2.2\n")
    later = config.stat().st_mtime_ns + 1_000_000_000
    os.utime(config, ns=(later, later))
    assert config_route("gpu1", 22, config=config).host == "10.2.2.2"
    assert parses == ["gpu1", "gpu1"]


def test_a_missing_identity_file_does_not_hide_the_route(tmp_path: Path) -> None:
    # Routing needs no key: an IdentityFile that does not exist (yet) must not
    # make the ProxyJump disappear (asyncssh would fail loading it).
    config = tmp_path / "config"
    config.write_text("Host gpu*\n  ProxyJump ops@bastion\n  IdentityFile /nonexistent/key\n")
    assert config_route("gpu7", 22, config=config) == ConfigRoute("gpu7", "ops@bastion")
