"""`host_key_policy: strict` checks every host key, whatever ~/.ssh/config says (issue 14.3).

Pure part: what known_hosts asyncssh gets and which ssh config settings are
reported as conflicts. The end-to-end part (a changed host key, a hostile ssh
config, HOME pointed at a temp dir) is in tests/test_heal.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.ssh.keys import TRUST_NOTHING, strict_known_hosts


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / ".ssh").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def resolve(home: Path, *, configured: str | None = None, use_ssh_config: bool = True):
    return strict_known_hosts(
        configured=configured, use_ssh_config=use_ssh_config, host="10.9.0.2", port=22, home=home
    )


def test_user_known_hosts_file_none_is_a_conflict_and_the_default_file_is_used(home: Path) -> None:
    (home / ".ssh" / "config").write_text("Host *\n  UserKnownHostsFile none\n")
    (home / ".ssh" / "known_hosts").write_text("10.9.0.2 ssh-ed25519 AAAA\n")
    result = resolve(home)
    assert result.known_hosts == [str(home / ".ssh" / "known_hosts")]
    (conflict,) = result.conflicts
    assert "UserKnownHostsFile none" in conflict and "strict" in conflict


def test_dev_null_and_relaxed_strict_checking_are_conflicts_real_files_are_kept(home: Path) -> None:
    other = home / ".ssh" / "other_known_hosts"
    other.write_text("")
    (home / ".ssh" / "config").write_text(
        f"Host *\n  UserKnownHostsFile /dev/null {other}\n  StrictHostKeyChecking=no\n"
    )
    result = resolve(home)
    assert result.known_hosts == [str(other)]
    assert len(result.conflicts) == 2
    assert any("/dev/null" in c for c in result.conflicts)
    assert any("StrictHostKeyChecking" in c for c in result.conflicts)


@pytest.mark.parametrize("word", ["no", "off", "accept-new", "No"])
def test_every_relaxed_strict_host_key_checking_is_reported(home: Path, word: str) -> None:
    (home / ".ssh" / "config").write_text(f"Host gpu*\n    StrictHostKeyChecking {word}\n")
    assert any("StrictHostKeyChecking" in c for c in resolve(home).conflicts)


def test_without_any_known_hosts_file_nothing_is_trusted(home: Path) -> None:
    (home / ".ssh" / "config").write_text("Host *\n  UserKnownHostsFile none\n")
    assert resolve(home).known_hosts == TRUST_NOTHING


def test_the_cluster_files_known_hosts_wins_over_ssh_config(home: Path, tmp_path: Path) -> None:
    (home / ".ssh" / "config").write_text("Host *\n  UserKnownHostsFile none\n")
    mine = tmp_path / "kh"
    mine.write_text("")
    assert resolve(home, configured=str(mine)).known_hosts == str(mine)
    assert resolve(home, configured=str(tmp_path / "missing")).known_hosts == TRUST_NOTHING


def test_ssh_config_not_read_when_use_ssh_config_is_off(home: Path) -> None:
    (home / ".ssh" / "config").write_text("Host *\n  UserKnownHostsFile none\n")
    assert resolve(home, use_ssh_config=False).conflicts == ()
