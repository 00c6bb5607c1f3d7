"""One round trip per host -> HostState (facts only; containers/plan/ decides).

The probe is a program file, `orchestrator/remote/probe.sh` (its header says
what it does on the host and why the attach path costs one docker process);
`probe_argv` gives its arguments. Its output is `@@cvs:` frames
(`remote/frames.py`); `parse_probe_output` turns them into a `HostState`.
Anything it cannot read becomes `error` with the container state unknown
(None), never "absent".
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tarfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from orchestrator import remote
from orchestrator.config import ContainerConfig
from orchestrator.containers.argv import image_inspect_argv, validate_container_name
from orchestrator.containers.inspection import (
    ContainerInfo,
    ContainerLimits,
    RuntimeOutputError,
    parse_container_inspect,
    parse_image_inspect,
    runtime_limits,
)
from orchestrator.containers.labels import LABEL_OWNER, LABEL_SSHD_PORT
from orchestrator.containers.route import ExecFacts
from orchestrator.containers.runtime_errors import classify_runtime_error
from orchestrator.containers.sshexec import exec_facts_of
from orchestrator.limits.cdi import SpecFile, spec_files
from orchestrator.limits.gpus import GPU, parse_discovery
from orchestrator.limits.gpus import MARKER as GPU_MARKER
from orchestrator.remote.frames import FrameError, Section, parse_sections
from orchestrator.remote.records import adopted_records, host_record
from orchestrator.remote.runtime import ContainerRuntime, RuntimeName

AccessMode = Literal["direct", "sudo", "none"]
ContainerState = Literal["absent", "running", "exited", "other"]
ErrorKind = Literal[
    "unreachable", "no_runtime", "no_access", "daemon_down", "garbled", "runtime_hung"
]

_SHA256_RE = re.compile(r"^[0-9a-f]{64}\b")


@dataclass(frozen=True)
class HostState:
    host: str
    reachable: bool = True
    error: str | None = None  # why the probe could not tell (daemon down, no access, garbled)
    error_kind: ErrorKind | None = None
    # How cvs reaches the runtime there (direct, sudo; none: it cannot); None:
    # could not tell (e.g. the daemon down). Formerly `docker_access`.
    access: AccessMode | None = None
    container: ContainerState | None = None  # None = unknown, NEVER treated as absent
    container_status: str | None = None  # docker's word (paused, restarting, created, …)
    container_id: str | None = None
    container_image_id: str | None = None
    container_image_readable: bool = True  # False when the container's image id is unreadable
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    started_at: str | None = None
    host_config: ContainerLimits | None = None  # parsed limits for drift checks
    init: bool | None = None  # the runtime's init is PID 1 (`run --init`); None: not known
    tag_image_id: str | None = None  # what cfg.image resolves to on this host now (None: absent)
    tag_repo_digests: tuple[str, ...] = ()
    tag_error: str | None = None  # image inspect failed for a reason other than "no such image"
    # --- capacity (issue 15): what the host has, for requests beyond it ---
    cpu_count: int | None = None  # None: not reported
    memory_total: int | None = None  # bytes (MemTotal)
    sshd_listening: bool | None = None  # None: not checked (not running, no /proc/net, exec failed)
    provision_marker: str | None = None  # sha256 of the script that provisioned the container
    exec_error: str | None = None  # why the in-container check could not run
    # network host + sshd wanted, our container not running: is the sshd port
    # taken on the host already (None: not checked), and by which cvs containers
    # ("NAME (cluster IDENTITY)"), so a start is refused before anything runs.
    sshd_port_busy: bool | None = None
    sshd_port_holders: tuple[str, ...] = ()
    # The host's GPUs, when the probe listed them (a GPU request, a host that
    # will launch); None: not listed (the prepare step discovers them).
    gpus: tuple[GPU, ...] | None = None
    # The CDI spec files the same listing printed (limits/cdi.py reads them).
    cdi_specs: tuple[SpecFile, ...] = ()
    # The runtime the probe was sent to reach (the cluster's container.runtime;
    # `access` says how it answered); rootless: the login user's podman.
    runtime_name: RuntimeName = "docker"
    rootless: bool = False
    # Rootless only (None elsewhere): "v1" or "v2", and on v2 the controllers
    # the login user's cgroup offers (what rootless podman can cap).
    cgroup: str | None = None
    cgroup_controllers: tuple[str, ...] = ()
    # Rootless podman launching with devices: the OCI runtime podman runs
    # (crun, runc; None: not asked or unreadable), for `--group-add keep-groups`.
    oci_runtime: str | None = None
    # The runtime daemon's version, asked only where CDI depends on it (docker
    # launching GPUs with container.cdi: always); None: not asked or unreadable.
    runtime_version: str | None = None

    # The container's environment, user, working directory and network, for
    # commands through its sshd (containers/sshexec.py); not compared.
    exec_facts: ExecFacts | None = field(default=None, compare=False, repr=False)

    @property
    def docker_access(self) -> AccessMode | None:
        """Deprecated: `access` (the same, for any runtime); kept for one release."""
        warnings.warn("HostState.docker_access is HostState.access", DeprecationWarning, 2)
        return self.access

    @classmethod
    def unreachable(cls, host: str, reason: str) -> HostState:
        return cls(host=host, reachable=False, error=reason, error_kind="unreachable")

    @classmethod
    def hung(cls, host: str, reason: str) -> HostState:
        """Reached, but the runtime did not answer in time: its state is unknown."""
        return cls(host=host, error=reason, error_kind="runtime_hung")

    @property
    def runtime(self) -> ContainerRuntime:
        """How to reach the runtime on this host, as the probe found it
        (unknown: the host decides on each command)."""
        if self.access in ("direct", "sudo"):
            return ContainerRuntime(self.access, self.runtime_name, self.rootless)
        return ContainerRuntime.unprobed(self.runtime_name, self.rootless)

    @property
    def known(self) -> bool:
        """Reachable, docker usable, and the container state determined."""
        return self.reachable and self.access in ("direct", "sudo") and self.container is not None


# --- the program's arguments -------------------------------------------------


def _capacity_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    """cpu_count and memory_total from the capacity frame (`CPUS MEMTOTAL_KB`,
    `-` for either when the host did not say); missing: nothing."""
    section = sections.get("capacity")
    if section is None:
        return {}
    words = section.stdout.split()
    if len(words) != 2:
        return {}
    out: dict[str, object] = {}
    if words[0].isdigit() and int(words[0]) > 0:
        out["cpu_count"] = int(words[0])
    if words[1].isdigit():
        out["memory_total"] = int(words[1]) * 1024
    return out


def inspect_image_arg(image: str) -> str:
    """The image as the probe's `docker inspect` names it: with a tag or digest.

    `docker inspect` without `--type` resolves each argument as a container
    first; a container name cannot hold ':' or '@', so a tagged reference is
    never mistaken for a container.
    """
    if image.startswith("sha256:"):
        return image
    last = image.rsplit("/", 1)[-1]
    return image if (":" in last or "@" in image) else f"{image}:latest"


def probe_argv(
    cfg: ContainerConfig | None,
    name: str,
    *,
    sshd_port: int,
    marker_path: str,
    port_check: bool = False,
    gpus: Literal["always", "stopped"] | None = None,
    gpu_root: str = "/",
    runtime: ContainerRuntime | None = None,
    oci: Literal["always", "stopped"] | None = None,
    version: Literal["always", "stopped"] | None = None,
) -> list[str]:
    """`sh -c PROBE cvs-probe ARG…` (remote/probe.sh): ready for an SSH exec
    (`shlex.join`) whatever the login shell is.

    `cfg` None probes docker access and the container only (no image tag).
    `port_check` (sshd wanted, network host): when the container is not
    running, whether its sshd port is taken on the host, and by whom.
    `gpus`: list the host's GPUs (under `gpu_root`) on every host ("always":
    all of them launch) or where the container does not run ("stopped").
    `runtime`: which runtime to reach (remote/runtime.py; default docker).
    `oci`: rootless podman only, when to ask which OCI runtime podman runs
    (as `gpus`: the device access a launch gets depends on it).
    `version`: when to ask the runtime daemon's version (as `gpus`: whether
    it takes CDI device names depends on it, limits/cdi.py).
    """
    runtime = runtime or ContainerRuntime()
    validate_container_name(name)
    if not 1 <= sshd_port <= 65535:
        raise ValueError(f"invalid sshd port {sshd_port}")
    if not marker_path.startswith("/"):
        raise ValueError(f"marker path must be absolute, got {marker_path!r}")
    image = ""
    if cfg is not None:
        image = inspect_image_arg(image_inspect_argv([], cfg.image)[-1])
        if not image or any(c.isspace() for c in image):
            raise ValueError(f"cannot probe {image!r}: the name holds white space")
    holders_filter = holders_format = ""
    if port_check:
        holders_filter = f"label={LABEL_SSHD_PORT}={sshd_port}"
        holders_format = "{{.Names}}\t" + runtime.label_column(LABEL_OWNER)
    return remote.argv(
        "probe",
        name,
        image,
        str(sshd_port),
        marker_path,
        remote.program("check"),
        holders_filter,
        holders_format,
        *_optional_args(
            [gpus, remote.program("gpus"), gpu_root.rstrip("/"), GPU_MARKER]
            if gpus is not None
            else ["", "", "", ""],
            runtime.flag or [""],
            [oci if oci is not None and runtime.rootless else ""],
            [version or ""],
        ),
    )


def _optional_args(*groups: list[str]) -> list[str]:
    """probe.sh's optional positional arguments, the trailing empty ones left off
    (a docker probe without GPUs sends none)."""
    args = [a for group in groups for a in group]
    while args and not args[-1]:
        args.pop()
    return args


# --- parsing -------------------------------------------------------------


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def _marker_value(text: str) -> str | None:
    text = text.strip()
    if not text:
        return None
    # Accept `sha256sum` output ("<hex>  <file>") as well as a bare digest.
    m = _SHA256_RE.match(text)
    return m.group(0) if m else text


def _marker_from_tar(raw: bytes) -> str | None:
    # `docker cp NAME:FILE -` writes a tar holding that one file.
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar:
                if member.isfile():
                    f = tar.extractfile(member)
                    return _marker_value(f.read().decode("utf-8", "replace")) if f else None
    except tarfile.TarError:
        return None
    return None


def _access_failure(
    host: str,
    direct: Section | None,
    sudo: Section | None,
    runtime: RuntimeName = "docker",
    other: str | None = None,
    rootless: bool = False,
) -> HostState:
    texts = [s for s in (direct, sudo) if s is not None]
    kinds = [classify_runtime_error(s.stderr or s.stdout, s.rc) for s in texts]
    labels = [
        label for label, s in ((runtime, direct), (f"sudo -n {runtime}", sudo)) if s is not None
    ]
    detail = "; ".join(
        f"{label}: {_first_line(s.stderr or s.stdout) or f'exit {s.rc}'}"
        for label, s in zip(labels, texts, strict=True)
    )
    state = (
        _docker_access_failure(host, kinds, detail)
        if runtime == "docker"
        else _podman_access_failure(host, runtime, kinds, detail, rootless)
    )
    if other is None or state.error is None:
        return state
    # The other runtime is here: perhaps the cluster names the wrong one.
    return replace(
        state,
        error=(
            f"{state.error}; this host has {other}: a cluster runs one runtime on every "
            f"host (image IDs, CLI spellings and GPU flags differ), so set "
            f"container.runtime: {other} if every host runs it, or split the cluster"
        ),
    )


def _docker_access_failure(host: str, kinds: Sequence[str], detail: str) -> HostState:
    if "daemon_down" in kinds:
        return HostState(
            host=host,
            error=f"docker daemon not reachable ({detail})",
            error_kind="daemon_down",
        )
    if kinds and kinds[0] == "not_installed":
        return HostState(
            host=host,
            access="none",
            error=f"docker is not installed or not on PATH ({detail})",
            error_kind="no_runtime",
        )
    return HostState(
        host=host,
        access="none",
        error=(
            "no docker access: plain `docker` and `sudo -n docker` both failed "
            f"({detail}); add the login user to the docker group or allow it "
            "passwordless sudo for docker"
        ),
        error_kind="no_access",
    )


def _podman_access_failure(
    host: str, runtime: RuntimeName, kinds: Sequence[str], detail: str, rootless: bool
) -> HostState:
    """No access to podman: the message names the runtime and the fix."""
    if kinds and kinds[-1] == "not_installed":
        return HostState(
            host=host,
            access="none",
            runtime_name=runtime,
            error=f"{runtime} is not installed or not on PATH ({detail})",
            error_kind="no_runtime",
        )
    how = (
        "rootless podman needs the login user's subuid/subgid ranges (/etc/subuid)"
        if rootless
        else f"log in as root or allow the login user passwordless `sudo -n {runtime}`"
    )
    return HostState(
        host=host,
        access="none",
        runtime_name=runtime,
        error=f"no {runtime} access ({detail}); {how}",
        error_kind="no_access",
    )


_CONTROLLER_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _cgroup_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    """cgroup and cgroup_controllers from the cgroup frame (rootless only);
    words from the host are kept only when they look like controller names."""
    words = sections["cgroup"].stdout.split() if "cgroup" in sections else []
    if not words or words[0] not in ("v1", "v2"):
        return {}
    controllers = tuple(w for w in words[1:] if _CONTROLLER_RE.fullmatch(w))
    return {"cgroup": words[0], "cgroup_controllers": controllers}


def _runtime_frame(sections: Mapping[str, Section]) -> tuple[RuntimeName, bool]:
    """The runtime frame (podman only; none: docker)."""
    words = sections["runtime"].stdout.split() if "runtime" in sections else []
    runtime: RuntimeName = "podman" if words[:1] == ["podman"] else "docker"
    return runtime, words[1:2] == ["rootless"]


def parse_probe_output(host: str, exit_status: int, stdout: str, stderr: str) -> HostState:
    """The probe's output on `host` -> HostState. Never raises on bad output."""
    try:
        sections, done = parse_sections(stdout)
    except FrameError as exc:
        return _garbled(host, str(exc), exit_status, stderr)
    if not done or exit_status != 0:
        why = "probe did not finish" if not done else f"probe exited {exit_status}"
        return _garbled(host, why, exit_status, stderr)

    tried = {n.split(".", 1)[1]: sec for n, sec in sections.items() if n.startswith("inspect.")}
    if not tried:
        return _garbled(host, "no runtime inspect section", exit_status, stderr)
    answered = [m for m, sec in tried.items() if _answered(sec)]
    runtime, rootless = _runtime_frame(sections)
    if not answered:
        other = sections["other"].stdout.strip() if "other" in sections else None
        failed = _access_failure(
            host, tried.get("direct"), tried.get("sudo"), runtime, other, rootless
        )
        return replace(failed, runtime_name=runtime, rootless=rootless)
    access: AccessMode = "direct" if answered[0] == "direct" else "sudo"
    inspect = tried[answered[0]]
    values: dict[str, object] = {
        "host": host,
        "access": access,
        "runtime_name": runtime,
        "rootless": rootless,
        **_cgroup_facts(sections),
    }
    values.update(_host_facts(sections))
    try:
        objects = _inspect_objects(inspect.stdout, runtime)
    except RuntimeOutputError as exc:
        return HostState(**values, error=str(exc), error_kind="garbled")  # type: ignore[arg-type]
    missing = set(_NO_SUCH_RE.findall(inspect.stderr))
    # `docker inspect A B` prints the objects it found in argument order and
    # names the missing ones on stderr: pair them up positionally.
    args = sections["args"].stdout.split() if "args" in sections else []
    if not args:
        return _garbled(host, "no args section", exit_status, stderr)
    name = args[0]
    found: dict[str, dict[str, Any] | None] = {}
    queue = list(objects)
    for arg in args:
        found[arg] = None if arg in missing or not queue else queue.pop(0)
    if len(args) > 1:
        values.update(_image_facts(args[1], found.get(args[1]), inspect.stderr, runtime))
    cobj = found.get(name)
    if cobj is None or not _is_container(cobj, name):
        # Not found, or NAME resolved to something else (an image of that
        # name, a container whose ID merely starts with it): no such container.
        return HostState(**values, container="absent")  # type: ignore[arg-type]
    try:
        cinfo = parse_container_inspect(json.dumps(cobj))
    except RuntimeOutputError as exc:
        return HostState(**values, error=str(exc), error_kind="garbled")  # type: ignore[arg-type]

    values.update(_container_facts(sections, cinfo, cobj, runtime))
    return HostState(**values)  # type: ignore[arg-type]


def _host_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    """What the probe says of the host beside its runtime's inspect."""
    values: dict[str, object] = {}
    values.update(_capacity_facts(sections))  # capacity (issue 15)
    values.update(_port_facts(sections))  # sshd port taken on the host (network host)
    values.update(_oci_facts(sections))  # rootless podman: crun or runc
    values.update(_version_facts(sections))  # docker with CDI: the daemon's version
    listed = sections.get("gpus")
    if listed is not None and listed.rc == 0:
        values["gpus"] = tuple(parse_discovery(listed.stdout))
        values["cdi_specs"] = tuple(spec_files(listed.stdout))
    return values


def _container_facts(
    sections: Mapping[str, Section],
    cinfo: ContainerInfo,
    cobj: dict[str, Any],
    runtime: RuntimeName,
) -> dict[str, object]:
    """The container's state, identity and limits, and what its host records
    and in-container check say."""
    labels = cinfo.labels
    adopted_by = adopted_records(sections).get(cinfo.id or "")
    if adopted_by is not None and LABEL_OWNER not in labels:
        # Adopted (issue 15): owned as if cvs had labelled it at start.
        labels = MappingProxyType({**labels, LABEL_OWNER: adopted_by})
    values: dict[str, object] = dict(
        container=cinfo.state,
        container_status=cinfo.status,
        container_id=cinfo.id,
        container_image_id=cinfo.image_id,
        container_image_readable=cinfo.image_id is not None
        and cinfo.image_id.startswith("sha256:"),
        labels=labels,
        started_at=cinfo.started_at,
        host_config=runtime_limits(runtime, cinfo.limits),
        init=cinfo.init,
    )
    with contextlib.suppress(ValueError):
        values["exec_facts"] = exec_facts_of(cobj)
    values.update(
        _in_container_facts(
            sections, running=cinfo.state == "running", container_id=cinfo.id, runtime=runtime
        )
    )
    return values


_NO_SUCH_RE = re.compile(r"^Error: No such object: (\S+)\s*$", re.MULTILINE)


def _answered(section: Section) -> bool:
    """docker reached the daemon and answered: what it did not find is absent.

    (Other stderr lines, like sudo's "unable to resolve host", are noise.)
    """
    return section.rc == 0 or bool(_NO_SUCH_RE.search(section.stderr))


def _inspect_objects(text: str, runtime: str = "docker") -> list[dict[str, Any]]:
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuntimeOutputError(
            f"{runtime} inspect: not JSON ({exc.msg} at char {exc.pos})"
        ) from None
    if not isinstance(data, list) or not all(isinstance(o, dict) for o in data):
        raise RuntimeOutputError(f"{runtime} inspect: expected a JSON list of objects")
    return data


def _is_container(obj: Mapping[str, Any], name: str) -> bool:
    return isinstance(obj.get("State"), dict) and str(obj.get("Name", "")).lstrip("/") == name


def _image_facts(
    arg: str, obj: Mapping[str, Any] | None, stderr: str, runtime: str = "docker"
) -> dict[str, object]:
    if obj is None:
        if arg in _NO_SUCH_RE.findall(stderr):
            return {}  # not on the host: tag_image_id None
        return {"tag_error": f"{runtime} inspect gave no answer for {arg}"}
    if "State" in obj or "RootFS" not in obj:
        return {"tag_error": f"{arg} does not name an image here"}
    try:
        info = parse_image_inspect(json.dumps(obj))
    except RuntimeOutputError as exc:
        return {"tag_error": str(exc)}
    return {"tag_image_id": info.id, "tag_repo_digests": info.repo_digests}


_OCI_RUNTIME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# `20.10.24+dfsg1`, `27.1.0`: what `docker version --format {{.Server.Version}}` prints.
_VERSION_RE = re.compile(r"v?\d+\.\d+[A-Za-z0-9.+~_-]{0,60}")


def _version_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    """The daemon's version from the `version` section, when asked and well formed."""
    version = sections.get("version")
    if version is None or version.rc != 0:
        return {}
    text = version.stdout.strip()
    return {"runtime_version": text} if _VERSION_RE.fullmatch(text) else {}


def _oci_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    """The OCI runtime's name (`podman info`), when asked and readable."""
    oci = sections.get("oci_runtime")
    if oci is None or oci.rc != 0:
        return {}
    name = oci.stdout.strip()
    return {"oci_runtime": name} if _OCI_RUNTIME_RE.fullmatch(name) else {}


def _port_facts(sections: Mapping[str, Section]) -> dict[str, object]:
    port = sections.get("port")
    if port is None:
        return {}
    busy = {"yes": True, "no": False}.get(port.stdout.strip())
    holders: list[str] = []
    listing = sections.get("port_holders")
    if listing is not None and listing.rc == 0:
        for line in listing.stdout.splitlines():
            cname, _, cluster = line.partition("\t")
            if cname.strip():
                holders.append(f"{cname.strip()} (cluster {cluster.strip() or '?'})")
    return {"sshd_port_busy": busy, "sshd_port_holders": tuple(holders)}


def _in_container_facts(
    sections: Mapping[str, Section],
    *,
    running: bool,
    container_id: str | None,
    runtime: str = "docker",
) -> dict[str, object]:
    """sshd liveness and the provisioning marker: from the host's records and
    the container's socket table when the probe had them, else from the
    in-container check (`exec`) or the marker copied out (`marker_tar`)."""
    facts: dict[str, object] = {}
    listen = host_record(sections, "listen", container_id) if running else None
    record = host_record(sections, "record", container_id)
    if listen in ("yes", "no"):
        facts["sshd_listening"] = listen == "yes"
    if record is not None and _SHA256_RE.match(record):
        facts["provision_marker"] = record
    ex = sections.get("exec")
    if ex is not None and ex.rc == 0 and running:
        lines = ex.stdout.splitlines()
        words = lines[0].split() if lines else []
        marker = lines[1].split() if len(lines) > 1 else []
        if words[:1] != ["listen"] or marker[:1] != ["marker"]:
            facts["exec_error"] = "unexpected output from the in-container check"
            return facts
        if "sshd_listening" not in facts:
            facts["sshd_listening"] = {"yes": True, "no": False}.get(words[1] if words[1:] else "")
        if marker[1:] == ["present"] and "provision_marker" not in facts:
            facts["provision_marker"] = _marker_value("\n".join(lines[2:]))
        return facts
    if ex is not None and ex.rc != 0 and running:
        facts["exec_error"] = _first_line(ex.stderr) or f"{runtime} exec exited {ex.rc}"
    tar = sections.get("marker_tar")
    if tar is not None and tar.rc == 0 and "provision_marker" not in facts:
        facts["provision_marker"] = _marker_from_tar(tar.out)
    return facts


def _garbled(host: str, why: str, exit_status: int, stderr: str) -> HostState:
    tail = _first_line(stderr[-2000:]) if stderr else ""
    detail = f"{why} (exit {exit_status})" + (f": {tail}" if tail else "")
    return HostState(host=host, error=f"unreadable probe output: {detail}", error_kind="garbled")
