"""Cluster file -> ClusterConfig: parse with positions, expand hosts, validate, resolve paths."""

from __future__ import annotations

import importlib.resources
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.config.cvs_json import _from_cvs, is_cvs_cluster
from orchestrator.config.documents import (
    ConfigError,
    Located,
    describe_value,
    first_problem,
    one_line,
    parse_document,
    read_document_text,
    validation_lines,
)
from orchestrator.config.gpu_devices import gpu_subset_problems
from orchestrator.config.hostlist import HostlistError, abbreviate_hosts, expand_hostlist
from orchestrator.config.model import ClusterConfig, ContainerConfig
from orchestrator.config.slurm import (
    HOST_SOURCES,
    Run,
    SlurmJob,
    SlurmOutsideJob,
    job_sshd_port,
    query_job,
    run_scontrol,
)
from orchestrator.errors import Param, Phrase, Text

# ---- hosts -----------------------------------------------------------------

DEFAULT_SETUP_SCRIPT = "default.sh"


def _expand_hosts(raw_hosts: Any, located: Located) -> tuple[list[Any], list[int]]:
    """Expanded host entries, and for each the index of the entry it came from."""
    if isinstance(raw_hosts, str):
        raw_hosts = [raw_hosts]
        single = True
    else:
        single = False
    if raw_hosts is None or (isinstance(raw_hosts, list) and not raw_hosts):
        raise ConfigError(located.error(["hosts"], "the host list is empty"))
    if not isinstance(raw_hosts, list):
        raise ConfigError(
            located.error(["hosts"], f"expected a list of hosts, got {describe_value(raw_hosts)}")
        )
    entries: list[Any] = []
    origins: list[int] = []
    for index, item in enumerate(raw_hosts):
        path: list[Any] = ["hosts"] if single else ["hosts", index]
        if isinstance(item, str):
            expr, overrides = item, {}
        elif isinstance(item, dict):
            if "name" not in item:
                raise ConfigError(located.error(path, "a host mapping needs a 'name'"))
            expr = item["name"]
            if not isinstance(expr, str):
                raise ConfigError(
                    located.error(
                        [*path, "name"], f"expected a host name, got {describe_value(expr)}"
                    )
                )
            overrides = {k: v for k, v in item.items() if k != "name"}
        else:
            raise ConfigError(
                located.error(
                    path,
                    f"expected a host name, address, hostlist or a mapping with 'name', "
                    f"got {describe_value(item)}",
                )
            )
        try:
            names = expand_hostlist(expr)
        except HostlistError as exc:
            name_path = [*path, "name"] if isinstance(item, dict) else path
            raise ConfigError(located.error(name_path, f"bad hostlist: {exc}")) from None
        for name in names:
            entries.append({"name": name, **overrides})
            origins.append(index)
    seen: dict[str, int] = {}
    for index, entry in zip(origins, entries, strict=True):
        name = entry["name"]
        if name in seen:
            first = seen[name]
            path = ["hosts"] if single else ["hosts", index]
            also = "" if first == index else f" (also in hosts[{first}])"
            raise ConfigError(located.error(path, f"duplicate host {name!r}{also}"))
        seen[name] = index
    return entries, origins


def _hosts_from_source(
    data: dict[str, Any],
    located: Located,
    hosts_from: str | None,
    env: Mapping[str, str],
    slurm_run: Run,
    *,
    cvs_nodes: bool = False,
    at_run_time: bool = False,
    job_over_ok: bool = False,
) -> tuple[dict[str, Any], SlurmJob | None, bool]:
    """`hosts: {from: slurm}` (or `--hosts-from slurm`): the hosts of the running
    job, asked of Slurm (config/slurm.py). A host the file lists by name keeps
    what the file says of it (its address wins over Slurm's NodeAddr). The
    flag: the hosts are deferred to the job (`at_run_time`, outside one)."""
    raw = data.get("hosts")
    where: Text
    if hosts_from is not None:
        where = Phrase(Param("hosts_from"), f" {hosts_from}")
    elif isinstance(raw, dict) and "name" not in raw:
        extra = sorted(str(k) for k in raw if k != "from")
        if extra:
            message = "takes only 'from' (hosts: {from: slurm})"
            raise ConfigError(located.error(["hosts", extra[0]], message))
        hosts_from = raw.get("from")
        if hosts_from not in HOST_SOURCES:
            message = f"unknown host source {hosts_from!r} (known: {', '.join(HOST_SOURCES)})"
            raise ConfigError(located.error(["hosts", "from"], message))
        where = located.error(["hosts", "from"], "slurm").rsplit(": ", 1)[0]
    else:
        return data, None, False
    if hosts_from not in HOST_SOURCES:
        raise ConfigError(
            Phrase(
                Param("hosts_from"),
                f" {hosts_from!r}: unknown host source (known: {', '.join(HOST_SOURCES)})",
            )
        )
    listed: dict[str, dict[str, Any]] = {}
    if isinstance(raw, list | str):
        entries, _ = _expand_hosts(raw, located)
        listed = {e["name"]: e for e in entries}
    try:
        job = query_job(env, where=where, run=slurm_run, over_ok=job_over_ok)
    except SlurmOutsideJob:
        if not at_run_time:
            raise
        # `cvs validate` outside a job: the hosts are the job's at run time;
        # the rest of the file is checked over the ones it lists, or one
        # stand-in.
        return {**data, "hosts": list(listed.values()) or [dict(RUN_TIME_HOST)]}, None, True
    if cvs_nodes:
        return {**data, "hosts": _job_nodes_listed(listed, job, where)}, job, False
    hosts = [{"name": n.name, "address": n.address, **listed.get(n.name, {})} for n in job.nodes]
    return {**data, "hosts": hosts}, job, False


def _job_nodes_listed(
    listed: Mapping[str, dict[str, Any]], job: SlurmJob, where: Text
) -> list[dict[str, Any]]:
    """A CVS file's node_dict under `hosts_from: slurm`: CVS's suites use the
    hosts node_dict names, so those stay the hosts, each a node of the job
    (at its NodeAddr)."""
    hosts = []
    for name, entry in listed.items():
        node = job.node(name)
        if node is None:
            nodes = abbreviate_hosts(n.name for n in job.nodes)
            raise ConfigError(
                f"{where}: node_dict lists {name!r}, which is not a node of Slurm job "
                f"{job.job_id} ({nodes}): name the job's nodes as Slurm does"
            )
        hosts.append({"name": name, "address": node.address, **entry})
    return hosts


# ---- paths -----------------------------------------------------------------


def _resolve(path: str, base_dir: Path) -> str:
    p = Path(os.path.expanduser(path))
    if not p.is_absolute():
        p = base_dir / p
    return os.path.normpath(str(p))


def _resolve_paths(
    cluster: ClusterConfig, base_dir: Path, located: Located, check_files: bool
) -> ClusterConfig:
    identity: list[str] = []
    for index, path in enumerate(cluster.ssh.identity_files):
        key = ["ssh", "identity_files", index]
        if not path.strip():
            raise ConfigError(located.error(key, "empty path"))
        resolved = _resolve(path, base_dir)
        if check_files and not os.path.isfile(resolved):
            raise ConfigError(located.error(key, f"identity file not found: {resolved}"))
        identity.append(resolved)
    ssh_update: dict[str, Any] = {"identity_files": identity}
    if cluster.ssh.known_hosts:
        ssh_update["known_hosts"] = _resolve(cluster.ssh.known_hosts, base_dir)
    update: dict[str, Any] = {"ssh": cluster.ssh.model_copy(update=ssh_update)}
    if cluster.state_dir:
        update["state_dir"] = _resolve(cluster.state_dir, base_dir)
    container = cluster.container
    if container is not None:
        script = container.setup_script
        if script is not None and not script.strip():
            script = None  # empty means the packaged default
        elif script is not None:
            script = _resolve(script, base_dir)
            if check_files and not os.path.isfile(script):
                raise ConfigError(
                    located.error(
                        ["container", "setup_script"], f"setup script not found: {script}"
                    )
                )
        container = container.model_copy(update={"setup_script": script})
        if check_files:
            container = _read_setup_script(container, script, located)
        update["container"] = container
    return cluster.model_copy(update=update)


def read_default_setup_script() -> tuple[str, bytes]:
    """The packaged default setup script: (where it is, its bytes). Raises OSError."""
    resource = importlib.resources.files("orchestrator.setup_scripts") / DEFAULT_SETUP_SCRIPT
    return str(resource), resource.read_bytes()


def _read_setup_script(
    container: ContainerConfig, script: str | None, located: Located
) -> ContainerConfig:
    """Read (and so hash) the setup script now, before any host is contacted."""
    try:
        if script is None:
            path, content = read_default_setup_script()
        else:
            path = script
            with open(script, "rb") as fh:
                content = fh.read()
    except (OSError, ModuleNotFoundError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        if script is None:
            raise ConfigError(
                f"{located.source}: the packaged default setup script cannot be read "
                f"({reason}): reinstall cvs-orchestrator or set container.setup_script"
            ) from None
        raise ConfigError(
            located.error(
                ["container", "setup_script"], f"cannot read setup script {script}: {reason}"
            )
        ) from None
    return container.with_setup_script(path, content)


# ---- entry points ----------------------------------------------------------


def _top_level(data: Any, source: str) -> tuple[dict[str, Any], Located, bool]:
    """The document as a mapping of string keys: a CVS cluster JSON converted
    (then True), `x-...` keys (YAML anchors' hooks) dropped."""
    located = Located(source, data)
    if data is None:
        raise ConfigError(f"{source}: the file is empty (expected a mapping with 'hosts')")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of keys (hosts, ssh, container, ...), "
            f"got {describe_value(data)}"
        )
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(
                located.error([key], f"keys must be strings, got {describe_value(key)}")
            )
    if is_cvs_cluster(data):
        return _from_cvs(data, located), Located(source, None), True
    # `x-...` top-level keys are free for YAML anchors to hang on (the
    # docker compose convention): `x-caps: &caps {max_cpus: 8}`.
    return {k: v for k, v in data.items() if not k.startswith("x-")}, located, False


def cluster_from_data(
    data: Any,
    source: str,
    base_dir: Path,
    *,
    check_files: bool = True,
    hosts_from: str | None = None,
    env: Mapping[str, str] | None = None,
    slurm_run: Run = run_scontrol,
    hosts_at_run_time: bool = False,
    job_over_ok: bool = False,
) -> ClusterConfig:
    """Validate already-parsed cluster data (a YAML/JSON document).

    `hosts_from="slurm"` replaces the file's hosts with the Slurm allocation's
    (`env`, default os.environ), as `hosts: {from: slurm}` in the file does."""
    data, located, cvs_nodes = _top_level(data, source)
    if cvs_nodes:
        in_file = data.pop("hosts_from", None)  # the command line's --hosts-from wins
        hosts_from = in_file if hosts_from is None else hosts_from
    for key in ("source", "source_file", "slurm"):
        if key in data:
            raise ConfigError(located.error([key], "is set by the loader (the file); remove it"))
    if "cvs_notes" in data and located.raw is not None:
        raise ConfigError(located.error(["cvs_notes"], "is set by the CVS-JSON import; remove it"))
    data, job, deferred = _hosts_from_source(
        data,
        located,
        hosts_from,
        os.environ if env is None else env,
        slurm_run,
        cvs_nodes=cvs_nodes,
        at_run_time=hosts_at_run_time,
        job_over_ok=job_over_ok,
    )
    if "hosts" not in data:
        raise ConfigError(f"{source}: hosts: required key is missing")
    entries, origins = _expand_hosts(data["hosts"], located)
    raw_single = isinstance(data["hosts"], str)
    document = {**data, "hosts": entries}
    head = data.get("head")
    if head is None:
        first = entries[0].get("name")
        document["head"] = first
    elif isinstance(head, str) and head not in {e["name"] for e in entries}:
        raise ConfigError(located.error(["head"], f"{head!r} is not one of the hosts"))
    document["source"] = str(base_dir)

    def user_path(path: list[Any]) -> list[Any]:
        # hosts[k] of the expanded list -> hosts[i] as written in the file.
        if (
            len(path) >= 2
            and path[0] == "hosts"
            and isinstance(path[1], int)
            and 0 <= path[1] < len(origins)
        ):
            raw_index = origins[path[1]]
            return ["hosts"] if raw_single else ["hosts", raw_index, *path[2:]]
        return path

    try:
        cluster = ClusterConfig.model_validate(document)
    except ValidationError as exc:
        lines = validation_lines(exc.errors(include_url=False), located, user_path, ClusterConfig)
        raise first_problem(lines) from None
    if job is not None:
        cluster = cluster.model_copy(update={"slurm": job})
        cluster = _job_sshd_port(cluster, job)
    elif cluster.container is not None and cluster.container.lifetime == "per_job" and not deferred:
        raise ConfigError(located.error(["container", "lifetime"], PER_JOB_OUTSIDE))
    if cluster.container is not None:
        for path, message in gpu_subset_problems(cluster.container):
            if cluster.cvs_notes:
                # A CVS file cannot drop CVS's default devices (lists only append).
                message += (
                    " (CVS's runtime defaults include privileged and /dev/dri: use the native "
                    "format to hold a GPU subset)"
                )
            raise ConfigError(located.error(path, message))
    return _resolve_paths(cluster, base_dir, located, check_files)


# The stand-in host `cvs validate` checks a `hosts: {from: slurm}` file over
# outside a job.
RUN_TIME_HOST = {"name": "slurm-node", "address": "127.0.0.1"}

PER_JOB_OUTSIDE = (
    "per_job containers live for a Slurm job, and its hosts do not come from one: run cvs "
    "inside an allocation (salloc, sbatch) with `hosts: {from: slurm}`, or set lifetime to "
    "per_run or persistent"
)


def _job_sshd_port(cluster: ClusterConfig, job: SlurmJob) -> ClusterConfig:
    """Inside a job, a per_run or per_job container's sshd listens on the
    job's port (config/slurm.py) unless the file sets `sshd.port`: two jobs
    on the same nodes with one file each get their own."""
    container = cluster.container
    if container is None or container.lifetime not in ("per_run", "per_job"):
        return cluster
    if "port" in container.sshd.model_fields_set:
        return cluster
    sshd = container.sshd.model_copy(update={"port": job_sshd_port(job.job_id)})
    return cluster.model_copy(update={"container": container.model_copy(update={"sshd": sshd})})


def parse_cluster(
    text: str,
    source: str,
    base_dir: Path,
    *,
    check_files: bool = True,
    hosts_from: str | None = None,
    env: Mapping[str, str] | None = None,
    slurm_run: Run = run_scontrol,
    hosts_at_run_time: bool = False,
    job_over_ok: bool = False,
) -> ClusterConfig:
    """Parse cluster-file text. `source` names the file in messages; relative
    paths in it resolve against `base_dir`. Raises ConfigError only."""
    try:
        data = parse_document(text, source)
        return cluster_from_data(
            data,
            source,
            Path(base_dir),
            check_files=check_files,
            hosts_from=hosts_from,
            env=env,
            slurm_run=slurm_run,
            hosts_at_run_time=hosts_at_run_time,
            job_over_ok=job_over_ok,
        )
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    except Exception as exc:  # any parser/validator surprise is still a config problem
        raise ConfigError(f"{source}: {one_line(f'{type(exc).__name__}: {exc}')}") from None


def load_cluster(
    path: str | Path,
    *,
    check_files: bool = True,
    hosts_from: str | None = None,
    env: Mapping[str, str] | None = None,
    slurm_run: Run = run_scontrol,
    hosts_at_run_time: bool = False,
    job_over_ok: bool = False,
) -> ClusterConfig:
    """Load and validate a cluster file (YAML, JSON, or CVS cluster JSON).

    `check_files=False` skips existence checks of identity files and the
    setup script (`cvs validate --no-check-files`, samples on another box).
    `hosts_at_run_time`: hosts from Slurm outside a job are not an error
    (`cvs validate`): the file is checked over the hosts it lists, or a
    stand-in, and `slurm` stays None. `job_over_ok`: a job that is over
    still gives its nodes (`cvs down`, `cvs status` after the job).
    """
    source = str(path)
    text = read_document_text(source, "cluster file")
    resolved = Path(os.path.expanduser(source)).resolve()
    cluster = parse_cluster(
        text,
        source,
        resolved.parent,
        check_files=check_files,
        hosts_from=hosts_from,
        env=env,
        slurm_run=slurm_run,
        hosts_at_run_time=hosts_at_run_time,
        job_over_ok=job_over_ok,
    )
    return cluster.model_copy(update={"source_file": str(resolved)})
