"""Per-cluster SSH keys: generated locally, private on disk, stable across runs."""

from __future__ import annotations

import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import asyncssh
import pytest

from orchestrator.config import ClusterConfig, HostSpec
from orchestrator.ssh.keys import ClusterKeys, default_state_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_first_load_creates_an_ed25519_user_key_and_one_host_key_per_host(tmp_path: Path) -> None:
    keys = ClusterKeys.load_or_create(tmp_path / "state", ["a", "b"])
    assert set(keys.host_keys) == {"a", "b"}
    for pair in [keys.user, *keys.host_keys.values()]:
        assert pair.public.startswith("ssh-ed25519 ")
        assert asyncssh.import_private_key(pair.private).algorithm == b"ssh-ed25519"
    blobs = {keys.user.public_blob, *(p.public_blob for p in keys.host_keys.values())}
    assert len(blobs) == 3


def test_state_dir_is_0700_and_every_key_file_0600(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ClusterKeys.load_or_create(state, ["a"])
    assert _mode(state) == 0o700
    files = [p for p in state.rglob("*") if p.is_file()]
    assert len(files) == 4  # user pair + host pair
    for path in files:
        assert _mode(path) == 0o600, path
    for d in [p for p in state.rglob("*") if p.is_dir()]:
        assert _mode(d) == 0o700, d


def test_loose_permissions_on_an_existing_key_are_tightened(tmp_path: Path) -> None:
    ClusterKeys.load_or_create(tmp_path, ["a"])
    key = tmp_path / "keys" / "cluster_ed25519"
    key.chmod(0o644)
    ClusterKeys.load_or_create(tmp_path, ["a"])
    assert _mode(key) == 0o600


def test_keys_are_reused_across_runs(tmp_path: Path) -> None:
    first = ClusterKeys.load_or_create(tmp_path, ["a", "b"])
    again = ClusterKeys.load_or_create(tmp_path, ["a", "b"])
    assert again.user == first.user
    assert dict(again.host_keys) == dict(first.host_keys)


def test_a_new_host_gets_a_new_key_and_the_others_keep_theirs(tmp_path: Path) -> None:
    first = ClusterKeys.load_or_create(tmp_path, ["a", "b"])
    grown = ClusterKeys.load_or_create(tmp_path, ["a", "b", "c"])
    assert grown.host_key("a") == first.host_key("a")
    assert grown.host_key("b") == first.host_key("b")
    assert grown.host_key("c").public_blob not in {
        first.host_key("a").public_blob,
        first.host_key("b").public_blob,
    }


def test_concurrent_creators_agree_on_one_key(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        loaded = list(pool.map(lambda _: ClusterKeys.load_or_create(tmp_path, ["a"]), range(8)))
    assert len({k.user.public for k in loaded}) == 1
    assert len({k.host_key("a").public for k in loaded}) == 1
    leftovers = [p.name for p in tmp_path.rglob(".*") if p.is_file()]
    assert leftovers == []


def test_openssh_reads_the_generated_keys(tmp_path: Path) -> None:
    keys = ClusterKeys.load_or_create(tmp_path, ["a"])
    out = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(tmp_path / "keys" / "hosts" / "a_ed25519")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert out.split()[:2] == keys.host_key("a").public_blob.split()


def test_a_host_without_a_loaded_key_is_a_clear_error(tmp_path: Path) -> None:
    keys = ClusterKeys.load_or_create(tmp_path, ["a"])
    with pytest.raises(KeyError, match="no sshd host key for 'zz'"):
        keys.host_key("zz")


@pytest.mark.parametrize("bad", ["../evil", "a/b", "", "-x"])
def test_host_names_that_are_not_file_names_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid host name"):
        ClusterKeys.load_or_create(tmp_path, [bad])


def test_default_state_dir_is_per_cluster_under_local_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cluster = ClusterConfig(name="lab", hosts=[HostSpec(name="a")])
    assert default_state_dir(cluster) == tmp_path / ".local/state/cvs/lab"
    pinned = cluster.model_copy(update={"state_dir": str(tmp_path / "elsewhere")})
    assert default_state_dir(pinned) == tmp_path / "elsewhere"
