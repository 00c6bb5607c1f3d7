"""Settings that would hand a container every GPU next to a `gpus` subset request.

cvs passes exactly the selected GPUs' device nodes (`/dev/dri/renderD*` for
AMD, `--gpus device=...` for NVIDIA). A `devices` entry naming the whole
`/dev/dri`, another render or card node, `/dev/nvidiaN`, or `/dev` itself, or
`privileged: true` (every host device), or a CDI GPU device
(`amd.com/gpu=all`) defeats that
subset silently; they are refused unless `gpus.allow_all_devices: true`.
`/dev/kfd` and `/dev/nvidiactl`/`nvidia-uvm` are shared control nodes that a
subset needs anyway: allowed.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.config.model import ContainerConfig, GPURequest

# Host paths that expose GPU device nodes beyond a subset.
_GPU_NODE_RE = re.compile(r"/dev/?|/dev/dri(/.*)?|/dev/nvidia[0-9]+|/dev/nvidia\*")


def _host_path(spec: str) -> str:
    # HOST[:CONTAINER[:PERMS]]. (A /dev bind mount is not listed: the device
    # cgroup still denies opening nodes that were not passed as devices.)
    return spec.split(":", 1)[0].rstrip("/") or "/"


# A CDI device reference (`amd.com/gpu=all`, `nvidia.com/gpu=0`): next to a
# request cvs picks the CDI devices itself, so any GPU kind here could widen it.
_CDI_GPU_RE = re.compile(r"[a-z0-9][a-z0-9.-]*\.[a-z]+/gpu=.+")


def exposes_all_gpus(path: str) -> bool:
    """True for a host path (or CDI GPU device) whose passthrough reaches GPUs
    outside a selected subset."""
    if _CDI_GPU_RE.fullmatch(path):
        return True
    p = path if path == "/" else path.rstrip("/")
    return p in ("/", "/dev") or bool(_GPU_NODE_RE.fullmatch(p))


def gpu_subset_problems(container: ContainerConfig) -> list[tuple[list[Any], str]]:
    """(key path, message) for each setting that defeats the `gpus` subset."""
    gpus = container.gpus
    if not isinstance(gpus, GPURequest) or gpus.allow_all_devices:
        return []
    fix = (
        "the container would see every GPU on the host, not the selected subset; "
        "remove it (cvs passes the selected GPUs' devices itself) or set "
        "gpus.allow_all_devices: true"
    )
    out: list[tuple[list[Any], str]] = []
    if container.privileged:
        out.append((["container", "privileged"], f"privileged: true next to a gpus request: {fix}"))
    for i, spec in enumerate(container.devices):
        if exposes_all_gpus(_host_path(spec)):
            out.append((["container", "devices", i], f"{spec!r} next to a gpus request: {fix}"))
    for i, arg in enumerate(container.extra_args):
        flag, _, value = arg.partition("=")
        if flag == "--privileged" or (
            flag == "--device" and value and exposes_all_gpus(_host_path(value))
        ):
            out.append((["container", "extra_args", i], f"{arg!r} next to a gpus request: {fix}"))
    return out
