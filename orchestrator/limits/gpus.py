"""GPUs: discovery (remote/gpus.sh's argv + parser), selection, vendor flags and env.

Everything here is pure. `up`'s prepare step runs `discovery_argv()` on each
launching host and hands its stdout to `parse_discovery()`; `select_gpus()` decides which devices
a container gets; `GPUSelection` turns that into `docker run` flags and the
visible-devices variables the framework inside expects.

Rules worth knowing:

- An AMD GPU is a render node (`/dev/dri/renderD*`) on a host with `/dev/kfd`:
  that pair is what ROCm needs inside the container. Render nodes whose PCI
  vendor (from sysfs) is known and is not AMD are ignored, so an NVIDIA or Intel
  render node never turns a host into a "mixed" one. Without `/dev/kfd` no AMD
  GPU is usable and none is reported. `amd-smi`/`rocm-smi` only add the type and
  memory, matched to render nodes by PCI address, else by order.
- An NVIDIA GPU is a row of `nvidia-smi --query-gpu` output.
- A type is a case-insensitive substring of the device name; a GPU whose memory
  is unknown never satisfies `min_memory`, and one whose name is unknown never
  satisfies `type`.
- Selection takes the lowest-indexed matching devices, exactly `count` of them
  (all matching ones when count is omitted), so the same inventory always gives
  the same devices.
- Mixed vendors on one host, or an unknown vendor, raise `GPUError` with the
  same wording wherever they are met.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from orchestrator import remote
from orchestrator.config import GPURequest
from orchestrator.config.units import format_size, parse_size

Vendor = Literal["amd", "nvidia"]
VENDORS: tuple[str, ...] = get_args(Vendor)
AMD_PCI_VENDOR = "0x1002"

MARKER = "@@cvs-gpu@@"
NVIDIA_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total,pci.bus_id",
    "--format=csv,noheader,nounits",
]
AMD_SMI_QUERY = ["amd-smi", "static", "--json"]
ROCM_SMI_QUERY = ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showbus", "--json"]

_RENDER_RE = re.compile(r"/dev/dri/renderD(\d+)$")
# CDI spec files the discovery prints (remote/gpus.sh; limits/cdi.py reads
# them): bounded, at most this many files of at most this many bytes.
CDI_MAX_FILES = 32
CDI_MAX_BYTES = 256 * 1024


class GPUError(ValueError):
    """A host's GPUs cannot be handled at all (mixed or unknown vendor, bad request)."""


def unknown_vendor_error(vendors: object) -> GPUError:
    """The one error for every path that meets a vendor it cannot serve."""
    return GPUError(
        f"unsupported GPU vendor setup {vendors!r}: a host must have GPUs of exactly one "
        f"known vendor ({', '.join(VENDORS)})"
    )


def check_vendor(vendor: object) -> Vendor:
    if vendor not in VENDORS:
        raise unknown_vendor_error(vendor)
    return vendor  # type: ignore[return-value]


@dataclass(frozen=True)
class GPU:
    vendor: Vendor
    index: int
    uuid: str | None = None
    # "" when unknown (an AMD render node without amd-smi/rocm-smi).
    name: str = ""
    memory_bytes: int | None = None
    # AMD only: the /dev/dri/renderD* path on the host (under the device root).
    render_node: str | None = None
    pci_bus: str | None = None

    def __post_init__(self) -> None:
        check_vendor(self.vendor)

    def describe(self) -> str:
        memory = "unknown memory" if self.memory_bytes is None else format_size(self.memory_bytes)
        return f"{self.name or 'unknown type'} ({memory})"


def host_vendor(inventory: list[GPU] | tuple[GPU, ...]) -> Vendor | None:
    """The one vendor of a host's GPUs; None without GPUs; GPUError when mixed."""
    vendors = sorted({g.vendor for g in inventory})
    if not vendors:
        return None
    if len(vendors) > 1:
        raise unknown_vendor_error("+".join(vendors))
    return check_vendor(vendors[0])


# ---------------------------------------------------------------- discovery


def discovery_argv(device_root: str = "/") -> list[str]:
    """`sh -c GPUS cvs-gpus ROOT MARKER` (remote/gpus.sh): the host's GPU facts
    in marked sections. `device_root` relocates /dev and /sys lookups (the
    sandbox's stand-in devices)."""
    return remote.argv(
        "gpus", device_root.rstrip("/"), MARKER, str(CDI_MAX_FILES), str(CDI_MAX_BYTES)
    )


def parse_discovery(stdout: str) -> list[GPU]:
    """The GPUs in a `discovery_argv()` output, ordered by index.

    Facts only: a host with GPUs of both vendors yields both (selection refuses).
    """
    sections = _split_sections(stdout)
    gpus = _parse_nvidia(sections.get("nvidia-smi", []))
    if any(line.strip() for line in sections.get("kfd", [])):
        if "amd-smi" in sections:
            info = _parse_amd_smi("\n".join(sections["amd-smi"]))
        else:
            info = _parse_rocm_smi("\n".join(sections.get("rocm-smi", [])))
        gpus += _amd_gpus(sections.get("render", []), info)
    return gpus


def split_sections(stdout: str) -> dict[str, list[str]]:
    """The discovery output's sections by name (`cdi PATH` for CDI specs)."""
    return _split_sections(stdout)


def _split_sections(stdout: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(MARKER + " "):
            current = sections.setdefault(line[len(MARKER) + 1 :].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def _parse_nvidia(lines: list[str]) -> list[GPU]:
    gpus = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        # index, uuid, name (may itself hold commas), memory.total MiB, pci.bus_id
        if len(fields) < 5 or not fields[0].isdigit():
            continue
        name = ", ".join(fields[2:-2])
        memory = fields[-2]
        gpus.append(
            GPU(
                vendor="nvidia",
                index=int(fields[0]),
                uuid=_known(fields[1]),
                name=name,
                memory_bytes=int(float(memory) * 1024**2) if _is_number(memory) else None,
                pci_bus=_pci(fields[-1]),
            )
        )
    return gpus


@dataclass(frozen=True)
class _AMDInfo:
    name: str
    memory_bytes: int | None
    pci_bus: str | None


def _parse_amd_smi(text: str) -> list[_AMDInfo]:
    data = _load_json(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", [])
    if not isinstance(data, list):
        return []
    infos = []
    for entry in data:
        if not isinstance(entry, dict):
            continue
        asic: dict[str, Any] = entry["asic"] if isinstance(entry.get("asic"), dict) else {}
        bus: dict[str, Any] = entry["bus"] if isinstance(entry.get("bus"), dict) else {}
        vram: dict[str, Any] = entry["vram"] if isinstance(entry.get("vram"), dict) else {}
        infos.append(
            _AMDInfo(
                name=_known(str(asic.get("market_name", ""))) or "",
                memory_bytes=_amd_smi_size(vram.get("size")),
                pci_bus=_pci(bus.get("bdf")),
            )
        )
    return infos


def _amd_smi_size(value: Any) -> int | None:
    # amd-smi has printed {"value": 196592, "unit": "MB"} and "196592 MB";
    # its MB are MiB.
    if isinstance(value, dict):
        number, unit = value.get("value"), str(value.get("unit", "B"))
    elif isinstance(value, str) and len(value.split()) == 2:
        number, unit = value.split()
    else:
        return None
    if not _is_number(number):
        return None
    try:
        return parse_size(f"{number}{unit.rstrip('Bb') or 'B'}")
    except ValueError:
        return None


def _parse_rocm_smi(text: str) -> list[_AMDInfo]:
    data = _load_json(text)
    if not isinstance(data, dict):
        return []
    cards = sorted(
        ((int(k[4:]), v) for k, v in data.items() if re.fullmatch(r"card\d+", k)),
        key=lambda kv: kv[0],
    )
    infos = []
    for _, fields in cards:
        lower = {str(k).lower(): str(v) for k, v in fields.items()}
        name = next(
            (
                lower[k]
                for k in ("card series", "device name", "card model")
                if _known(lower.get(k, ""))
            ),
            "",
        )
        memory = lower.get("vram total memory (b)", "")
        infos.append(
            _AMDInfo(
                name=name,
                memory_bytes=int(memory) if memory.isdigit() else None,
                pci_bus=_pci(lower.get("pci bus")),
            )
        )
    return infos


def _amd_gpus(render_lines: list[str], infos: list[_AMDInfo]) -> list[GPU]:
    nodes = []
    for line in render_lines:
        parts = line.rsplit(" ", 2)
        if len(parts) != 3 or not _RENDER_RE.search(parts[0]):
            continue
        path, bdf, pci_vendor = parts
        if pci_vendor != "-" and pci_vendor.lower() != AMD_PCI_VENDOR:
            continue
        minor = int(_RENDER_RE.search(path).group(1))  # type: ignore[union-attr]
        nodes.append((minor, path, _pci(bdf)))
    nodes.sort()
    by_bus = {i.pci_bus: i for i in infos if i.pci_bus}
    # Pairing by order is only trusted when nothing better exists and counts agree.
    by_order = len(infos) == len(nodes) and not any(bus for _, _, bus in nodes)
    gpus = []
    for index, (_, path, bus) in enumerate(nodes):
        info = by_bus.get(bus) if bus else (infos[index] if by_order else None)
        gpus.append(
            GPU(
                vendor="amd",
                index=index,
                name=info.name if info else "",
                memory_bytes=info.memory_bytes if info else None,
                render_node=path,
                pci_bus=bus or (info.pci_bus if info else None),
            )
        )
    return gpus


def _load_json(text: str) -> Any:
    # The smi tools sometimes print warnings before the JSON document.
    starts = [i for i in (text.find("["), text.find("{")) if i >= 0]
    if not starts:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[min(starts) :])[0]
    except json.JSONDecodeError:
        return None


def _known(value: str) -> str | None:
    value = value.strip()
    if not value or value in {"-", "N/A"} or value.startswith("[N"):
        return None
    return value


def _is_number(value: object) -> bool:
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def _pci(value: object) -> str | None:
    """Canonical PCI address: lower case, 4-digit domain (nvidia-smi prints 8)."""
    if not isinstance(value, str):
        return None
    m = re.fullmatch(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", value)
    if not m:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


# ---------------------------------------------------------------- selection

GPURequestSpec = Literal["all"] | GPURequest | None


@dataclass(frozen=True)
class GPUSelection:
    """The devices a container gets, in the order it will number them."""

    vendor: Vendor | None = None
    gpus: tuple[GPU, ...] = ()

    def docker_args(self, vendor: str | None = None) -> list[str]:
        """`docker run` flags. `vendor`, if given, must be the selection's vendor."""
        if vendor is not None:
            check_vendor(vendor)
        if not self.gpus:
            return []
        own = check_vendor(self.vendor)
        if vendor is not None and vendor != own:
            raise unknown_vendor_error(f"{vendor}+{own}")
        if own == "nvidia":
            ids = ",".join(g.uuid or str(g.index) for g in self.gpus)
            # --gpus parses its value as CSV: the quotes keep "device=a,b" one field.
            return ["--gpus", f'"device={ids}"']
        nodes = [_amd_render_node(g) for g in self.gpus]
        roots = {root for root, _ in nodes}
        if len(roots) != 1:
            raise GPUError(f"AMD render nodes under different device roots: {sorted(roots)}")
        args = ["--device", _device_spec(roots.pop(), "/dev/kfd")]
        for root, inner in nodes:
            args += ["--device", _device_spec(root, inner)]
        return args

    def env(self) -> dict[str, str]:
        """Visible-devices variables in the container's own numbering (0..N-1)."""
        if not self.gpus:
            return {}
        ordinals = ",".join(str(i) for i in range(len(self.gpus)))
        if check_vendor(self.vendor) == "nvidia":
            return {"CUDA_VISIBLE_DEVICES": ordinals, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        # ROCR_VISIBLE_DEVICES alone: HIP_VISIBLE_DEVICES on top would renumber
        # the already-filtered devices a second time.
        return {"ROCR_VISIBLE_DEVICES": ordinals}


@dataclass(frozen=True)
class Unsatisfiable:
    """A host cannot give what was asked; the run refuses before launching."""

    request: Literal["all"] | GPURequest
    inventory: tuple[GPU, ...]
    reason: str

    def message(self, host: str) -> str:
        return (
            f"{host}: GPU request {describe_request(self.request)} cannot be satisfied: "
            f"{self.reason}; the host has {describe_inventory(self.inventory)}"
        )


def select_gpus(
    inventory: list[GPU] | tuple[GPU, ...], request: GPURequestSpec
) -> GPUSelection | Unsatisfiable:
    """The devices a container gets: `None` → none, `all` → every GPU, a request
    → the lowest-indexed `count` devices matching type and per-device memory."""
    if request is None:
        return GPUSelection()
    vendor = host_vendor(inventory)
    ordered = tuple(sorted(inventory, key=lambda g: g.index))
    if request == "all":
        if not ordered:
            return Unsatisfiable(request, ordered, "no GPUs found")
        return GPUSelection(vendor, ordered)
    if not isinstance(request, GPURequest):
        raise GPUError(f"gpus: expected 'all' or {{count, type, min_memory}}, got {request!r}")
    min_memory = _min_memory(request)
    matching = [g for g in ordered if _matches(g, request.type, min_memory)]
    wanted = request.count if request.count is not None else max(len(matching), 1)
    if len(matching) < wanted:
        found = f"{len(matching)} matching" if matching else "none matching"
        return Unsatisfiable(request, ordered, f"needs {wanted}, found {found}")
    return GPUSelection(vendor, tuple(matching[:wanted]))


def describe_request(request: Literal["all"] | GPURequest) -> str:
    if request == "all":
        return "'all'"
    parts = [
        f"{key}: {value}"
        for key, value in request.model_dump(exclude={"allow_all_devices"}).items()
        if value is not None
    ]
    return "{" + ", ".join(parts) + "}"


def describe_inventory(inventory: tuple[GPU, ...] | list[GPU]) -> str:
    if not inventory:
        return "no GPUs"
    counts = Counter(g.describe() for g in sorted(inventory, key=lambda g: g.index))
    kinds = ", ".join(f"{n}x {what}" for what, n in counts.items())
    vendors = "+".join(sorted({g.vendor for g in inventory}))
    return f"{len(inventory)} {vendors} GPU(s): {kinds}"


def _min_memory(request: GPURequest) -> int | None:
    if request.min_memory is None:
        return None
    try:
        return parse_size(request.min_memory)
    except ValueError as exc:
        raise GPUError(f"gpus.min_memory: {exc}") from None


def _matches(gpu: GPU, gpu_type: str | None, min_memory: int | None) -> bool:
    if gpu_type is not None and gpu_type.casefold() not in gpu.name.casefold():
        return False
    return min_memory is None or (gpu.memory_bytes is not None and gpu.memory_bytes >= min_memory)


def _amd_render_node(gpu: GPU) -> tuple[str, str]:
    """(device root, path inside the container) of an AMD GPU's render node."""
    m = _RENDER_RE.search(gpu.render_node or "")
    if m is None:
        raise GPUError(f"AMD GPU {gpu.index} has no /dev/dri/renderD* node to pass")
    path = gpu.render_node or ""
    return path[: m.start()], path[m.start() :]


def _device_spec(root: str, inner: str) -> str:
    # Same path inside as the host's real /dev path: ROCm looks nodes up by
    # their minor number, so renderD129 must stay renderD129.
    if not root:
        return inner
    if ":" in root:
        raise GPUError(f"device root {root!r} contains ':', which docker --device cannot take")
    return f"{posixpath.join(root, inner.lstrip('/'))}:{inner}"


# ------------------------------------------------- user env vs. the selection

# Variables a user (cluster `env`, `container.env`, a step's env, `exec -e`)
# could set to see GPUs other than the ones cvs selected.
VISIBILITY_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "NVIDIA_VISIBLE_DEVICES",
)
_ORDINALS_RE = re.compile(r"[0-9]+(?:,[0-9]+)*")


def guard_visible_devices(
    env: Mapping[str, str], request: GPURequestSpec, *, count: int | None
) -> tuple[dict[str, str], list[str]]:
    """`env` without any GPU-visibility variable that could widen cvs's subset,
    and one warning per variable removed.

    Only a subset request matters (`gpus: {count: 2, ...}`): with `all` or no
    `gpus` block cvs selected nothing to protect. Inside the container the
    selected GPUs are numbered 0..count-1 (cvs sets ROCR_/CUDA_VISIBLE_DEVICES
    to that), so a value naming only those ordinals narrows and is kept;
    anything else (`all`, UUIDs, an ordinal >= count, or any value when the
    count is unknown) is removed and the selection's own value stays in
    effect. NVIDIA_VISIBLE_DEVICES is always removed: the container runtime
    reads it to expose devices, so even `all` there would widen the subset.
    """
    if not isinstance(request, GPURequest):
        return dict(env), []
    kept: dict[str, str] = {}
    warnings: list[str] = []
    for key, value in env.items():
        if key not in VISIBILITY_VARS:
            kept[key] = value
            continue
        narrowing = (
            key != "NVIDIA_VISIBLE_DEVICES"
            and count is not None
            and _ORDINALS_RE.fullmatch(value.strip()) is not None
            and all(int(i) < count for i in value.strip().split(","))
        )
        if narrowing:
            kept[key] = value
            continue
        what = f"{count} selected GPU(s), numbered 0..{count - 1}" if count else "the selected GPUs"
        warnings.append(
            # The name only: cvs never prints an env value (they may be secrets).
            f"env {key} ignored: it could expose GPUs beyond the {what} "
            f"(gpus: {describe_request(request)}); cvs sets the visible devices itself"
        )
    return kept, warnings
