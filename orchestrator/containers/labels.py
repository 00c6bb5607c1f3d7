"""The labels cvs puts on the containers it starts, and what they prove.

A container is this cluster's when `LABEL_OWNER` carries the cluster's
identity (`is_ours`); the other labels say under which lifetime, invocation,
sshd port, Slurm job and GPUs it was started, and the config hash that
`up` and `status` compare for drift (containers/drift.py). Removal goes by
the container ID probed or created, never by a name alone (containers/argv.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from orchestrator.config import ContainerConfig
from orchestrator.config.model import DEPRECATED_CONTAINER_KEYS

# Label keys the orchestrator puts on containers it creates. A container is
# "ours" when LABEL_OWNER carries this cluster's name (see `is_ours`). The key
# keeps its first spelling: containers already running carry it.
LABEL_OWNER = "io.cvs.managed"
LABEL_CONFIG_HASH = "io.cvs.config-hash"
# The lifetime the container was started under: a per_run cluster never
# owns (so never removes) a container labelled persistent.
LABEL_LIFETIME = "io.cvs.lifetime"
# The invocation that started it: rollback and a run's tear-down remove only
# what their own invocation started.
LABEL_INVOCATION = "io.cvs.invocation"
# The port its in-container sshd listens on: with network host another
# cluster's probe names this container when that port is taken.
LABEL_SSHD_PORT = "io.cvs.sshd-port"
# The Slurm job whose invocation started it (hosts from Slurm): a per_run
# container goes when that job ends (containers/jobend.py, `cvs slurm epilog`).
LABEL_SLURM_JOB = "io.cvs.slurm-job"
# The host's GPU indices it was given ("2,3"): a later job compares them with
# its own allocation before attaching.
LABEL_GPUS = "io.cvs.gpus"


def config_hash(cfg: ContainerConfig) -> str:
    """Short, stable hash of the container block (label value for drift checks)."""
    data = cfg.model_dump(mode="json")
    # Keys added with the runtime seam count only when set: a docker
    # container started before them keeps its hash (no drift warning).
    for key, default in (("runtime", "docker"), ("rootless", False), ("cdi", "auto")):
        if data.get(key) == default:
            data.pop(key, None)
    # How the image reaches the hosts, not the container.
    data.pop("distribute", None)
    data.pop("spread_transport", None)
    if isinstance(data.get("sshd"), dict):
        # How commands reach the container (sshd.exec), not the container.
        data["sshd"].pop("exec", None)
    # Renamed keys hash under their old names: a rename changes no container's hash.
    for old, new in DEPRECATED_CONTAINER_KEYS.items():
        if new in data:
            data[old] = data.pop(new)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def managed_labels(
    cluster_name: str,
    cfg_hash: str | None = None,
    *,
    our_label: str = LABEL_OWNER,
    lifetime: str | None = None,
    invocation: str | None = None,
    sshd_port: int | None = None,
    slurm_job: str | None = None,
    gpus: tuple[int, ...] | None = None,
) -> dict[str, str]:
    """The labels `run_argv` should get so `is_ours` recognises the container.

    `cluster_name` is the cluster's identity (`cluster_identity`): its
    explicit name, or the cluster file's path when the name is the default.
    """
    labels = {our_label: cluster_name}
    if cfg_hash is not None:
        labels[LABEL_CONFIG_HASH] = cfg_hash
    if lifetime is not None:
        labels[LABEL_LIFETIME] = lifetime
    if invocation is not None:
        labels[LABEL_INVOCATION] = invocation
    if sshd_port is not None:
        labels[LABEL_SSHD_PORT] = str(int(sshd_port))
    if slurm_job is not None:
        labels[LABEL_SLURM_JOB] = slurm_job
    if gpus:
        labels[LABEL_GPUS] = ",".join(str(int(i)) for i in gpus)
    return labels


def is_ours(
    labels: Mapping[str, str],
    cluster_name: str,
    *,
    our_label: str = LABEL_OWNER,
    lifetime: str | None = None,
) -> bool:
    """Whether this cluster created the container (another cluster's is foreign).

    With `lifetime`, a container labelled with another lifetime is not ours
    either: the same file switched from persistent to per_run must not treat
    the persistent set as disposable. (Containers from before the lifetime
    label count by identity alone.)
    """
    if labels.get(our_label) != cluster_name:
        return False
    recorded = labels.get(LABEL_LIFETIME)
    return lifetime is None or recorded is None or recorded == lifetime
