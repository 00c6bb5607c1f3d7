"""openssh_argv and the ssh_config file that carries the cluster's settings to
a jump host (OpenSSH passes -F to the jump's ssh, never -i or -o)."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import ClusterConfig, HostSpec, SSHConfig
from orchestrator.errors import UsageError
from orchestrator.ssh import openssh
from orchestrator.ssh.openssh import JUMP_CONFIG_NAME, jump_config, openssh_argv


def cluster(**ssh: Any) -> ClusterConfig:
    settings = {"user": "ops", "identity_files": ["/keys/id"], "known_hosts": "/kh", **ssh}
    return ClusterConfig(
        name="lab", hosts=[HostSpec(name="a", address="10.0.0.5")], ssh=SSHConfig(**settings)
    )


def test_config_carries_every_setting_then_the_users_files() -> None:
    text = jump_config(cluster(identity_files=["/keys/id", "/my keys/id2"], keepalive=15))
    assert text.splitlines() == [
        "Host *",
        "  User ops",
        '  IdentityFile "/keys/id"',
        '  IdentityFile "/my keys/id2"',
        "  IdentitiesOnly yes",
        "  StrictHostKeyChecking yes",
        '  UserKnownHostsFile "/kh"',
        "  ConnectTimeout 10",
        "  ServerAliveInterval 15",
        "  ServerAliveCountMax 3",
        # After ours: ssh keeps the first value, so these cannot relax checking.
        "  Include ~/.ssh/config",
        "  Include /etc/ssh/ssh_config",
    ]


def test_config_without_ssh_config_includes_nothing() -> None:
    text = jump_config(cluster(use_ssh_config=False, keepalive=0))
    assert "Include" not in text
    assert "ServerAliveInterval" not in text


def test_policy_off_writes_no_known_hosts_and_quiets_the_warning() -> None:
    text = jump_config(cluster(host_key_policy="off"))
    assert "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n" in text


def test_relative_and_home_paths_are_made_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.chdir("/tmp")
    text = jump_config(cluster(identity_files=["~/id", "rel/id"], known_hosts="~/kh"))
    assert '  IdentityFile "/home/u/id"\n  IdentityFile "/tmp/rel/id"\n' in text
    assert '  UserKnownHostsFile "/home/u/kh"\n' in text


@pytest.mark.parametrize(
    "ssh",
    [
        {"identity_files": ["/k/id\n  ProxyCommand evil"]},
        {"identity_files": ['/k/i"d']},
        {"identity_files": ["/k/%d/id"]},
        {"identity_files": ["/k/${HOME}/id"]},
        {"identity_files": ["/k/id\\"]},
        {"known_hosts": "/kh\nHost *"},
        {"known_hosts": "/k#h"},
    ],
)
def test_values_that_could_add_config_are_refused(ssh: dict[str, Any], tmp_path: Path) -> None:
    c = cluster(proxy_jump="bastion", **ssh)
    with pytest.raises(UsageError, match="cannot be passed to ssh"):
        jump_config(c)
    with pytest.raises(UsageError):
        openssh_argv(c, "a", "true", tty=False, state_dir=tmp_path)
    assert not (tmp_path / JUMP_CONFIG_NAME).exists()


def test_without_a_jump_the_argv_is_options_only(tmp_path: Path) -> None:
    argv = openssh_argv(cluster(use_ssh_config=False), "a", "true", tty=True, state_dir=tmp_path)
    assert argv == [
        "ssh", "-t", "-F", "/dev/null", "-i", "/keys/id",
        "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", "UserKnownHostsFile=/kh", "-o", "ConnectTimeout=10",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
        "-p", "22", "-l", "ops", "10.0.0.5", "--", "true",
    ]  # fmt: skip
    assert not list(tmp_path.iterdir())


def test_a_known_hosts_path_with_a_space_is_quoted_for_o() -> None:
    argv = openssh_argv(cluster(known_hosts="/my dir/kh"), "a", "true", tty=False)
    assert 'UserKnownHostsFile="/my dir/kh"' in argv


@pytest.mark.parametrize("use_ssh_config", [True, False])
def test_with_a_jump_the_config_file_replaces_the_default_files(
    use_ssh_config: bool, tmp_path: Path
) -> None:
    c = cluster(proxy_jump="ops@bastion:2222,gw", use_ssh_config=use_ssh_config)
    state = tmp_path / "state"
    argv = openssh_argv(c, "a", "true", tty=False, state_dir=state)
    path = state / JUMP_CONFIG_NAME
    # -F replaces -F /dev/null; the target still gets the settings as options too.
    assert argv == [
        "ssh", "-T", "-F", str(path), "-i", "/keys/id",
        "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", "UserKnownHostsFile=/kh", "-o", "ConnectTimeout=10",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
        "-J", "ops@bastion:2222,gw",
        "-p", "22", "-l", "ops", "10.0.0.5", "--", "true",
    ]  # fmt: skip
    assert path.read_text() == jump_config(c)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Rewritten each time, from the cluster as it is now.
    c2 = cluster(proxy_jump="bastion", known_hosts="/other")
    openssh_argv(c2, "a", "true", tty=False, state_dir=state)
    assert '"/other"' in path.read_text()
    assert [p.name for p in state.iterdir()] == [JUMP_CONFIG_NAME]


def test_jump_config_goes_to_the_clusters_state_dir_by_default(tmp_path: Path) -> None:
    c = cluster(proxy_jump="bastion").model_copy(update={"state_dir": str(tmp_path / "st")})
    argv = openssh_argv(c, "a", "true", tty=False)
    assert argv[3] == str(tmp_path / "st" / JUMP_CONFIG_NAME)


def test_ssh_takes_our_values_over_an_included_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real client's reading of the file (`ssh -G` resolves, connects to nothing).
    if shutil.which("ssh") is None:
        pytest.skip("needs OpenSSH's client")
    users = tmp_path / "user_config"
    users.write_text(
        "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
        "  User root\n  IdentityFile /other/id\n  ConnectTimeout 99\n"
    )
    monkeypatch.setattr(openssh, "SSH_CONFIG_FILES", (str(users),))
    c = cluster(proxy_jump="bastion", known_hosts="/my dir/kh", connect_timeout=4)
    path = openssh.write_jump_config(c, tmp_path / "state")
    resolved = subprocess.run(
        ["ssh", "-G", "-F", str(path), "bastion"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert "stricthostkeychecking true" in resolved
    assert "userknownhostsfile /my dir/kh" in resolved
    assert "user ops" in resolved
    assert "connecttimeout 4" in resolved
    # IdentityFile accumulates; IdentitiesOnly keeps ssh to these files and ours come first.
    identities = [line for line in resolved if line.startswith("identityfile ")]
    assert identities[0] == "identityfile /keys/id"
