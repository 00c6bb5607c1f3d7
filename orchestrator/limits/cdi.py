"""GPUs through CDI (Container Device Interface): spec parsing and device choice.

Pure. The probe reads the CDI spec files a host publishes (`/etc/cdi`,
`/var/run/cdi`) and hands their text to `parse_spec`; `cdi_devices_for`
pairs the selected GPUs (chosen by `limits.gpus.select_gpus`, the same
count / type / memory rules as without CDI) with the CDI devices that expose
exactly them; `cdi_run_args` spells the `--device VENDOR/CLASS=NAME` flags for
the runtime, or says why it cannot.

How a CDI device is paired with a GPU: by the device nodes its
`containerEdits` add. An AMD GPU is its render node (`/dev/dri/renderD128`,
the same path discovery found), an NVIDIA GPU its `/dev/nvidiaN` (N = the
index nvidia-smi printed). A CDI device is used for one GPU only when the
GPU nodes it adds are that GPU's and nothing else: a device that adds two
GPUs' nodes (`all`, or a vendor's grouping) would hand the container more
than it asked for, so it is never chosen for a subset. Shared control nodes
(`/dev/kfd`, `/dev/nvidiactl`, `/dev/nvidia-uvm`) do not count as a GPU.

Runtimes: podman resolves CDI names itself (4.x reads `/etc/cdi` and
`/var/run/cdi`). Docker needs 25 or newer with its `cdi` feature on (the
default from 27); Debian's docker.io 20.10 has none, and asking for CDI
there is a clear error, never a silent fallback to raw device nodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from orchestrator.limits.gpus import GPU, GPUSelection, split_sections
from orchestrator.remote.runtime import ContainerRuntime

CDIMode = Literal["auto", "always", "never"]
RuntimeName = Literal["docker", "podman"]


# `vendor.tld/class`, as the CDI spec defines a kind.
KIND_RE = re.compile(r"[a-z0-9][a-z0-9.-]*\.[a-z]+/[a-zA-Z0-9][a-zA-Z0-9_.-]*")
# A device name: letters, digits, '_', '-', '.', ':' (the spec's own rule).
DEVICE_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.:-]*")
# A fully qualified CDI device reference, as `--device` takes it.
QUALIFIED_RE = re.compile(KIND_RE.pattern + "=" + DEVICE_NAME_RE.pattern)

_AMD_RENDER_RE = re.compile(r"/dev/dri/renderD\d+")
_NVIDIA_NODE_RE = re.compile(r"/dev/nvidia(\d+)")
_CARD_RE = re.compile(r"/dev/dri/card\d+")
# Vendor kinds cvs knows the GPUs of.
GPU_KINDS = {"amd": ("amd.com/gpu",), "nvidia": ("nvidia.com/gpu",)}


class CDIError(ValueError):
    """A CDI spec that cannot be read, or CDI asked for where it cannot work."""


@dataclass(frozen=True)
class CDIDevice:
    """One device of a CDI spec: `kind=name`, and the host device nodes it adds."""

    kind: str
    name: str
    host_nodes: tuple[str, ...]
    env: tuple[str, ...] = ()  # variable names the spec sets (values never kept)
    spec_file: str = ""

    @property
    def qualified(self) -> str:
        return f"{self.kind}={self.name}"


def parse_spec(text: str, source: str = "") -> list[CDIDevice]:
    """The devices in one CDI spec (YAML or JSON). CDIError when it is not one.

    `source` names the file in errors. A device whose name or nodes do not
    have the spec's shape is an error, not skipped: a half-read spec must
    not make cvs pick a device whose nodes it did not see.
    """
    where = source or "CDI spec"
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CDIError(f"{where}: not YAML or JSON ({_first_line(str(exc))})") from None
    if not isinstance(data, dict):
        raise CDIError(f"{where}: expected a mapping with cdiVersion, kind, devices")
    kind = data.get("kind")
    if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
        raise CDIError(f"{where}: kind {kind!r} is not vendor.tld/class")
    if not isinstance(data.get("cdiVersion"), str):
        raise CDIError(f"{where}: no cdiVersion")
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise CDIError(f"{where}: no devices")
    common_nodes, common_env = _edits(data.get("containerEdits"), where)
    out = []
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict):
            raise CDIError(f"{where}: devices[{i}] is not a mapping")
        name = dev.get("name")
        if not isinstance(name, str) or not DEVICE_NAME_RE.fullmatch(name):
            raise CDIError(f"{where}: devices[{i}].name {name!r} is not a CDI device name")
        nodes, env = _edits(dev.get("containerEdits"), f"{where}: devices[{i}]")
        out.append(
            CDIDevice(
                kind=kind,
                name=name,
                host_nodes=tuple(dict.fromkeys(common_nodes + nodes)),
                env=tuple(dict.fromkeys(common_env + env)),
                spec_file=source,
            )
        )
    return out


def _edits(edits: Any, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(host paths of the device nodes, names of the env variables) an edit adds."""
    if edits is None:
        return (), ()
    if not isinstance(edits, dict):
        raise CDIError(f"{where}: containerEdits is not a mapping")
    nodes = []
    for j, node in enumerate(edits.get("deviceNodes") or ()):
        path = node.get("hostPath") or node.get("path") if isinstance(node, dict) else None
        if not isinstance(path, str) or not path.startswith("/"):
            raise CDIError(f"{where}: deviceNodes[{j}] has no absolute path")
        nodes.append(path)
    env = []
    for item in edits.get("env") or ():
        if isinstance(item, str) and "=" in item:
            env.append(item.partition("=")[0])
    return tuple(nodes), tuple(env)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


@dataclass(frozen=True)
class SpecFile:
    """One spec file as the probe read it (text already bounded)."""

    path: str
    text: str


def spec_files(discovery_stdout: str) -> list[SpecFile]:
    """The CDI spec files in a GPU discovery's output (`cdi PATH` sections)."""
    return [
        SpecFile(name[4:], "\n".join(lines))
        for name, lines in split_sections(discovery_stdout).items()
        if name.startswith("cdi /")
    ]


def parse_specs(files: Sequence[SpecFile]) -> tuple[list[CDIDevice], list[str]]:
    """Every device of every readable spec, and one problem line per spec that
    could not be read (reported, never silently dropped). A kind=name defined
    twice is a problem too: which one a runtime uses is not cvs's to guess,
    so neither is used."""
    devices: list[CDIDevice] = []
    problems: list[str] = []
    for f in files:
        try:
            devices += parse_spec(f.text, f.path)
        except CDIError as exc:
            problems.append(str(exc))
    seen: dict[str, list[CDIDevice]] = {}
    for d in devices:
        seen.setdefault(d.qualified, []).append(d)
    kept = []
    for name, ds in seen.items():
        if len(ds) > 1:
            files_ = ", ".join(sorted({d.spec_file for d in ds}))
            problems.append(f"CDI device {name} is defined more than once ({files_}); not used")
        else:
            kept.append(ds[0])
    return kept, problems


# ------------------------------------------------------------------- pairing


def gpu_node(gpu: GPU) -> str | None:
    """The one host device node that is this GPU (not a shared control node)."""
    if gpu.vendor == "amd":
        return gpu.render_node
    return f"/dev/nvidia{gpu.index}"


def _gpu_nodes_of(device: CDIDevice) -> set[str]:
    """The per-GPU nodes among a device's nodes (render/card/nvidiaN)."""
    return {
        n
        for n in device.host_nodes
        if _AMD_RENDER_RE.search(n) or _CARD_RE.search(n) or _NVIDIA_NODE_RE.search(n)
    }


def cdi_devices_for(
    selection: GPUSelection, devices: Sequence[CDIDevice]
) -> tuple[CDIDevice, ...] | str:
    """The CDI device for each selected GPU, in the selection's order, or why
    not (a string naming the GPU that no single-GPU CDI device covers).

    A candidate must be of the GPU vendor's kind and its per-GPU nodes must be
    exactly that GPU's node: a device adding another GPU's node (or a card
    node, which is a second way into some GPU) is never used for a subset.
    """
    if not selection.gpus:
        return ()
    vendor = selection.vendor or ""
    kinds = GPU_KINDS.get(vendor, ())
    chosen = []
    for gpu in selection.gpus:
        node = gpu_node(gpu)
        matches = [
            d
            for d in devices
            if d.kind in kinds and node is not None and _gpu_nodes_of(d) == {node}
        ]
        if len(matches) != 1:
            what = "no" if not matches else f"{len(matches)}"
            return (
                f"{what} CDI device of kind {'/'.join(kinds) or vendor} adds exactly "
                f"GPU {gpu.index}'s node {node or '?'}"
            )
        chosen.append(matches[0])
    return tuple(chosen)


# ------------------------------------------------------------------- runtimes


def parse_version(text: str) -> tuple[int, int] | None:
    """`20.10.24+dfsg1` -> (20, 10); None when it does not start with N.N."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def runtime_cdi_problem(runtime: RuntimeName, version: str | None) -> str | None:
    """Why this runtime cannot take `--device vendor/class=name`, or None."""
    since = ContainerRuntime.unprobed(runtime).cdi_since
    if since is None:
        return None
    parsed = parse_version(version or "")
    if parsed is None:
        return f"{runtime}'s version is unknown, and CDI needs {runtime} {since[0]} or newer"
    if parsed < since:
        return (
            f"{runtime} {parsed[0]}.{parsed[1]} has no CDI (it came in {runtime} {since[0]}, "
            f"with the daemon's `cdi` feature on); upgrade {runtime}, use podman, or set "
            "container.cdi: never to pass the GPUs' device nodes"
        )
    return None


def use_cdi(
    mode: CDIMode,
    runtime: RuntimeName,
    version: str | None,
    selection: GPUSelection,
    devices: Sequence[CDIDevice],
) -> tuple[CDIDevice, ...] | str | None:
    """The decision, from facts: the CDI devices to pass (a tuple), device nodes
    as without CDI (None), or a refusal (a string naming why and the fix).

    - `never`: device nodes.
    - `auto`: CDI when the host's specs cover every selected GPU one to one
      and the runtime is podman. Docker stays on device nodes in `auto` (its
      CDI needs a daemon feature cvs cannot see from the CLI).
    - `always`: CDI or refuse.
    """
    if mode == "never" or not selection.gpus:
        return None
    paired = cdi_devices_for(selection, devices)
    if mode == "auto":
        # A runtime whose CDI depends on its version and a daemon feature
        # (docker) stays on device nodes.
        if ContainerRuntime.unprobed(runtime).cdi_since is not None or isinstance(paired, str):
            return None
        return paired
    problem = runtime_cdi_problem(runtime, version)
    if problem is not None:
        return problem
    if isinstance(paired, str):
        return f"container.cdi: always, but {paired}"
    return paired


def cdi_run_args(devices: Sequence[CDIDevice]) -> list[str]:
    """`--device kind=name` per device, each name checked for its shape."""
    args: list[str] = []
    for d in devices:
        if not QUALIFIED_RE.fullmatch(d.qualified):
            raise CDIError(f"invalid CDI device name {d.qualified!r}")
        args += ["--device", d.qualified]
    return args


def describe_devices(devices: Sequence[CDIDevice]) -> str:
    """`amd.com/gpu=0,1` for people: one kind, the names comma-separated."""
    by_kind: dict[str, list[str]] = {}
    for d in devices:
        by_kind.setdefault(d.kind, []).append(d.name)
    return " ".join(f"{k}={','.join(names)}" for k, names in by_kind.items())
