"""The host's records of containers: the one module that owns them.

Docker cannot relabel a running container, so cvs keeps two kinds of record
on each host, one file per full container ID in the login user's state
directory (`${XDG_STATE_HOME:-$HOME/.local/state}/cvs`; remote/records.sh):

- provisioned/ID: the sha256 of the setup script that provisioned ID, written
  when it succeeded, so that an attach learns "provisioned" without a
  `docker exec`;
- adopted/ID: the cluster that took ID over (`up` with adopt), read by the
  probe as if cvs had labelled the container at start.

A new container is a new ID, so a record can never vouch for a container it
was not written for; the probe reads only the inspected ID's. Records of
containers cvs removes go with them; others are pruned after 60 days.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from orchestrator import remote
from orchestrator.remote.frames import Section

STATE_DIR = "${XDG_STATE_HOME:-$HOME/.local/state}/cvs"

_ID_RE = re.compile(r"[0-9a-f]{64}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def _check_id(container_id: str | None) -> str:
    if container_id is None or not _ID_RE.fullmatch(container_id):
        raise ValueError(f"invalid container ID {container_id!r} (64 hex digits)")
    return container_id


def provisioned_argv(container_id: str, sha256: str) -> list[str]:
    """Record that `container_id` was provisioned with the script `sha256`.
    Never fails: a record that cannot be written costs the next probe a
    `docker exec`, nothing more."""
    _check_id(container_id)
    if not _SHA256_RE.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return remote.argv("record", "provisioned", container_id, sha256)


def adopted_argv(container_id: str | None, cluster: str) -> list[str]:
    """Record that `cluster` owns `container_id` (prints `adopted ID12`)."""
    _check_id(container_id)
    if not cluster or "\n" in cluster or "\0" in cluster:
        raise ValueError(f"invalid cluster name {cluster!r} for an adoption record")
    return remote.argv("record", "adopted", str(container_id), cluster)


def forget_argv(*container_ids: str) -> list[str]:
    """Drop the records of containers cvs removed."""
    for cid in container_ids:
        _check_id(cid)
    return remote.argv("record", "forget", *container_ids)


def forget_listed_command(ids_var: str = "ids") -> str:
    """Host shell text: drop the records of the containers whose IDs the shell
    variable `ids_var` lists (a removal by label, whose IDs only the host
    knows). Words that are not full container IDs are skipped."""
    if not re.fullmatch(r"[a-z_]+", ids_var):
        raise ValueError(f"invalid shell variable name {ids_var!r}")
    # Unquoted on purpose: the IDs are words; records.sh checks each.
    return f"{shlex.join(remote.argv('record', 'forget'))} ${ids_var}"


def adopted_records(sections: Mapping[str, Section]) -> dict[str, str]:
    """container ID -> cluster name, from the probe's `adopted` frame."""
    section = sections.get("adopted")
    if section is None:
        return {}
    out: dict[str, str] = {}
    for line in section.stdout.splitlines():
        cid, _, cluster = line.partition(" ")
        if _ID_RE.fullmatch(cid) and cluster.strip():
            out[cid] = cluster.strip()
    return out


def host_record(sections: Mapping[str, Section], tag: str, container_id: str | None) -> str | None:
    """The value of line frame `tag` (`ID VALUE`) when it is about `container_id`."""
    section = sections.get(tag)
    if section is None or container_id is None:
        return None
    words = section.stdout.split()
    return words[1] if len(words) == 2 and words[0] == container_id else None
