"""PURE: which cluster-file setting a `docker run` error comes from, and the fix.

`docker run` fails on a host with the runtime's words (`error setting rlimit
type 8: operation not permitted`, `Unable to find group render`); the user
wrote `ulimits: {memlock: -1}` and `group_add: [video, render]`. `hint_for`
maps the error text and the container block (with the line each key was
written on, `config.documents.key_lines`) to one `Hint`: the key, its line,
and what to do. Table-driven: each rule is a pattern over the error and a
function naming the key; the first rule that matches and finds its key wins.
Settings covered: ulimits, group_add, devices, cap_add, security_opt,
privileged, volumes, shm_size, runtime (via extra_args).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.config import ContainerConfig
from orchestrator.remote.runtime import ContainerRuntime, daemon_word

# Linux's RLIMIT_* numbers (asm-generic/resource.h), as runc reports them.
RLIMITS = {
    0: "cpu",
    1: "fsize",
    2: "data",
    3: "stack",
    4: "core",
    5: "rss",
    6: "nproc",
    7: "nofile",
    8: "memlock",
    9: "as",
    10: "locks",
    11: "sigpending",
    12: "msgqueue",
    13: "nice",
    14: "rtprio",
    15: "rttime",
}


@dataclass(frozen=True)
class Hint:
    """`container.ulimits.memlock: -1 (cluster.yaml:72): this host does not ...`"""

    key: str  # dotted path in the cluster file: container.ulimits.memlock, container.group_add[1]
    value: str  # what the file says there
    line: int | None  # where it was written; None: not known (JSON, built in code)
    fix: str

    def text(self, source: str | None = None) -> str:
        where = ""
        if self.line is not None:
            where = f" ({source}:{self.line})" if source else f" (line {self.line})"
        return f"{self.key}: {self.value}{where}: {self.fix}"


# (key, value, fix) or None: the rule matched the error but the config has no such setting.
_Found = tuple[str, str, str] | None
_Rule = tuple[re.Pattern[str], Callable[[re.Match[str], ContainerConfig], _Found]]


def _ulimit(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    name = RLIMITS.get(int(m.group(1)))
    implied = ContainerRuntime.unprobed(cfg.runtime, cfg.rootless).ulimits_implied
    if name in implied and name not in cfg.ulimits:
        return _implied_ulimit(name, cfg)
    if name is None or name not in cfg.ulimits:
        return None
    value = str(cfg.ulimits[name])
    return (
        f"container.ulimits.{name}",
        value,
        f"this host does not allow raising {name} to {'unlimited' if value == '-1' else value} "
        f"(its {daemon_word(cfg.runtime)} runs without CAP_SYS_RESOURCE, or under a lower "
        "hard limit): set a "
        f"value the host allows (`ulimit -H -{_ULIMIT_FLAGS.get(name, 'a')}` there shows it) "
        "or remove the key",
    )


_ULIMIT_FLAGS = {"memlock": "l", "nofile": "n", "stack": "s", "nproc": "u", "core": "c"}


def _implied_ulimit(name: str, cfg: ContainerConfig) -> _Found:
    """podman 4 sets nofile and nproc to their maximum (1048576) whenever any
    --ulimit is given and those two are not: the file never said them."""
    if not cfg.ulimits:
        return None
    given = ", ".join(f"{k}={v}" for k, v in cfg.ulimits.items())
    return (
        "container.ulimits",
        given,
        f"with any ulimit set, podman raises {name} to its maximum (1048576) unless it is "
        f"given too, and this host does not allow that: set ulimits.{name} to a value the "
        f"host allows (`ulimit -H -{_ULIMIT_FLAGS[name]}` there shows it)",
    )


def _group(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    group = m.group(1)
    if group not in cfg.group_add:
        return None
    index = cfg.group_add.index(group)
    return (
        f"container.group_add[{index}]",
        group,
        f"the image has no group {group!r} ({cfg.runtime} looks names up inside the "
        "container): "
        f"give its numeric GID instead (`getent group {group}` on the host shows it) or "
        "remove it",
    )


def _listed(key: str, items: list[str], needle: str) -> tuple[str, str] | None:
    """The first entry of list `key` naming `needle` (or a glob, `/dev/infiniband/*`,
    matching it)."""
    for index, item in enumerate(items):
        path = item.split(":", 1)[0]
        if needle and (needle in item or fnmatch.fnmatchcase(needle, path)):
            return f"container.{key}[{index}]", item
    return None


def _device(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    found = _listed("devices", cfg.devices, m.group(1))
    if found is None:
        return None
    return (
        *found,
        f"{cfg.runtime} could not open this device on the host (gone, or not a device node): "
        "fix the path or remove it",
    )


def _capability(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    cap = m.group(1).upper().removeprefix("CAP_")
    for index, name in enumerate(cfg.cap_add):
        if name.upper().removeprefix("CAP_") == cap:
            return (
                f"container.cap_add[{index}]",
                name,
                f"{cfg.runtime} does not know this capability: use a name from capabilities(7) "
                "without CAP_ (SYS_PTRACE, IPC_LOCK), or remove it",
            )
    return None


def _security_opt(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    word = next((g for g in m.groups() if g), "")
    for index, opt in enumerate(cfg.security_opt):
        if word and word.lower() in opt.lower():
            return (
                f"container.security_opt[{index}]",
                opt,
                f"this host's {cfg.runtime} cannot apply it (an unknown option, a profile that "
                "does not exist there, or AppArmor/SELinux not enabled): fix or remove it",
            )
    return None


def _volume(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    path = next(g for g in m.groups() if g)
    found = _listed("volumes", cfg.volumes, path)
    if found is None:
        return None
    return (
        *found,
        "the host path does not exist on this host, or the entry is not "
        "HOST_PATH:CONTAINER_PATH[:ro]: create the directory there or fix the entry",
    )


def _shm_size(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    key = "container.shm_size" if cfg.shm_size is not None else "container.resources.shm_size"
    value = cfg.shm_size if cfg.shm_size is not None else cfg.resources.shm_size
    if value is None:
        return None
    return (
        key,
        value,
        f"{cfg.runtime} refused this size, or the host has less memory for /dev/shm: lower it",
    )


def _runtime(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    name = m.group(1)
    runtime = getattr(cfg, "runtime", None)
    if isinstance(runtime, str) and runtime == name:
        key, value = "container.runtime", runtime
    else:
        found = _listed("extra_args", cfg.extra_args, name)
        if found is None:
            return None
        key, value = found
    return (
        key,
        value,
        f"this host's {daemon_word(cfg.runtime)} has no runtime {name!r} (`{cfg.runtime} info` "
        "lists the ones it has): install and register it there, or remove the setting",
    )


def _privileged(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    if not cfg.privileged:
        return None
    return (
        "container.privileged",
        "true",
        f"this host's {cfg.runtime} cannot start privileged containers (its "
        f"{daemon_word(cfg.runtime)} lacks the "
        "capabilities, e.g. in a user namespace or a nested container): set privileged: "
        "false and grant what the tests need with devices, cap_add and group_add",
    )


def _caps(m: re.Match[str], cfg: ContainerConfig) -> _Found:
    if not cfg.cap_add:
        return None
    return (
        "container.cap_add",
        ", ".join(cfg.cap_add),
        f"this host's {cfg.runtime} cannot grant these capabilities (its own bounding set lacks "
        "them, e.g. in a nested container): remove the ones it lacks",
    )


# Texts as docker 20.10 / runc print them (tests/test_hints.py has real ones).
_RULES: list[_Rule] = [
    (re.compile(r"error setting rlimit type (\d+)", re.I), _ulimit),
    (re.compile(r"unable to find group ([^\s:;,'\"]+)", re.I), _group),
    (
        re.compile(
            r"(?:error gathering device information while adding custom device "
            r"|no such device:? )\"?([^\s\"]+)",
            re.I,
        ),
        _device,
    ),
    (re.compile(r"unknown capability:? \"?([A-Za-z_]+)", re.I), _capability),
    (
        re.compile(
            r"(?:invalid --security-opt[^\"]*\"([^\"]+)\""
            r"|opening (seccomp|apparmor) profile"
            r"|(apparmor|seccomp|selinux|label)\b[^;]*"
            r"(?:not found|not enabled|could not be loaded))",
            re.I,
        ),
        _security_opt,
    ),
    (
        re.compile(
            r"(?:bind source path does not exist:? ([^\s\"]+)"
            r"|invalid volume specification:? '([^']+)')",
            re.I,
        ),
        _volume,
    ),
    (re.compile(r"(?:shm.*(?:invalid|too large)|invalid size.*shm)", re.I), _shm_size),
    (
        re.compile(
            r"(?:unknown runtime specified|unknown or invalid runtime name):? ([\w.-]+)", re.I
        ),
        _runtime,
    ),
    # "operation not permitted" is what many refusals say: only a privileged
    # container makes it that setting's fault, else the capabilities asked for.
    (
        re.compile(r"unable to apply caps|operation not permitted.*(?:devices|mount)", re.I),
        _privileged,
    ),
    (re.compile(r"unable to apply caps", re.I), _caps),
]


def hint_for(
    error: str, cfg: ContainerConfig | None, lines: Mapping[str, int] | None = None
) -> Hint | None:
    """The setting `error` (from `docker run` / `docker start`) comes from, with
    the line it was written on (`lines`: `config.documents.key_lines`) and the
    fix; None when no rule recognises it or the config has no such setting."""
    if cfg is None:
        return None
    lines = lines or {}
    for pattern, find in _RULES:
        m = pattern.search(error)
        if m is None:
            continue
        found = find(m, cfg)
        if found is None:
            continue
        key, value, fix = found
        return Hint(key=key, value=value, line=_line(key, lines), fix=fix)
    return None


def _line(key: str, lines: Mapping[str, int]) -> int | None:
    """The key's line; for a key the file spells differently (CVS JSON, the
    `container.shm_size` vs `resources.shm_size` spellings) the nearest
    enclosing key that has one."""
    while key:
        if key in lines:
            return lines[key]
        cut = max(key.rfind("."), key.rfind("["))
        key = key[:cut] if cut > 0 else ""
    return None
