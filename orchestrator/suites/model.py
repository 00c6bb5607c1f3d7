"""Suite files: lookup by name, the typed model, one-line load errors.

A suite is a YAML file of named steps that run across the cluster's hosts:

    name: test_demo
    description: run the demo tool everywhere
    steps:
      - name: version
        run: /opt/demo/bin/cvs-demo
        expect: {stdout: '^cvs-demo ok '}

A name is looked up in `./suites`, then each directory of `$CVS_SUITES_PATH`,
then the examples shipped in the `orchestrator.suites` package; anything that
looks like a path is loaded as one. Every problem is a `ConfigError` whose
message is one line naming the file and the key path (or line:column).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from orchestrator.config import ENV_NAME_RE, Model
from orchestrator.config.documents import (
    ConfigError,
    Located,
    MarkingLoader,
    describe_value,
    read_document_text,
    validation_lines,
    yaml_error,
)
from orchestrator.config.model import CONTAINER_USER_RE, SET_BY_LOADER, WORKDIR_RE

SUITE_SUFFIXES = (".yaml", ".yml")
SUITES_PATH_ENV = "CVS_SUITES_PATH"
SHIPPED_PACKAGE = "orchestrator.suites"
# Step names become directory names under the run dir's logs/ and junit classnames.
STEP_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SUITE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

Origin = Literal["path", "./suites", "$CVS_SUITES_PATH", "shipped"]


def _compile(pattern: str | None) -> str | None:
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    return pattern


class Expect(Model):
    """What a step's result must look like on every host it ran on."""

    exit_code: int = Field(default=0, description="The exit code every host must give")
    # Searched with re.MULTILINE (`^` and `$` match per line).
    stdout: str | None = Field(
        default=None, description="A regex that must match somewhere in each host's stdout"
    )
    not_stdout: str | None = Field(
        default=None, description="A regex that must match nowhere in each host's stdout"
    )

    _regex = field_validator("stdout", "not_stdout")(_compile)

    def stdout_re(self) -> re.Pattern[str] | None:
        return re.compile(self.stdout, re.MULTILINE) if self.stdout is not None else None

    def not_stdout_re(self) -> re.Pattern[str] | None:
        return re.compile(self.not_stdout, re.MULTILINE) if self.not_stdout is not None else None


class CopySpec(Model):
    """A `copy:` step: SRC (relative to the suite file) to DEST on each of the step's hosts."""

    src: str = Field(description="A local file or directory, relative to the suite file")
    dest: str = Field(
        description="Where it goes on each host: inside it when it is a directory or ends "
        "with /, else the new name"
    )

    @field_validator("src", "dest")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip() or "\n" in v or "\0" in v:
            raise ValueError("must be a path (non-empty, one line)")
        return v


class Step(Model):
    name: str = Field(description="The step's name (its log directory and junit classname)")
    # Exactly one of `run` and `copy`.
    run: str | None = Field(default=None, description="Shell text to run on each of its hosts")
    copy_: CopySpec | None = Field(
        default=None, alias="copy", description="Files to ship instead of a command (below)"
    )
    on: Literal["container", "host"] = Field(
        default="container", description="Where it runs: in the container, or on the host OS"
    )
    # api.select_hosts
    hosts: str = Field(
        default="all",
        description="`all`, `head`, or names / globs / hostlists, comma-separated",
    )
    timeout: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds per host; unset: the cluster's ssh.command_timeout",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment for this step (sent over stdin)"
    )
    workdir: str | None = Field(
        default=None,
        description="Working directory in the container (absolute); unset: the image's WORKDIR",
    )
    user: str | None = Field(
        default=None,
        description="User in the container; unset: container.user, else the image's USER",
    )
    expect: Expect = Field(default_factory=Expect, description="What the result must look like")
    continue_on_failure: bool = Field(
        default=False,
        description="Go on with the next steps after this one fails (the run still fails)",
    )
    mpi: bool = Field(
        default=False,
        description="Run once on the head container with CVS_MPI_HOSTFILE, CVS_MPI_HOSTS and "
        "CVS_MPI_NP set",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not STEP_NAME_RE.fullmatch(v):
            raise ValueError(
                f"invalid step name {v!r} (letters, digits, '_', '.', '-'; at most 64; "
                "it names the step's log directory)"
            )
        return v

    @field_validator("run")
    @classmethod
    def _run(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("is empty")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not ENV_NAME_RE.fullmatch(key):
                raise ValueError(f"invalid environment variable name {key!r}")
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        if v is not None and not WORKDIR_RE.fullmatch(v):
            raise ValueError(f"expected an absolute path, got {v!r}")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        if v is not None and not CONTAINER_USER_RE.fullmatch(v):
            raise ValueError(f"invalid user {v!r} (NAME, UID, NAME:GROUP or UID:GID)")
        return v

    @model_validator(mode="after")
    def _placement(self) -> Step:
        if self.on == "host" and (self.workdir is not None or self.user is not None):
            raise ValueError("workdir and user apply in the container; remove them or 'on: host'")
        return self

    @model_validator(mode="after")
    def _run_or_copy(self) -> Step:
        if (self.run is None) == (self.copy_ is None):
            raise ValueError("a step has either 'run' (a command) or 'copy' ({src, dest})")
        if self.copy_ is not None and self.mpi:
            raise ValueError("a copy step cannot be an mpi step; remove 'mpi'")
        return self

    @model_validator(mode="after")
    def _mpi_placement(self) -> Step:
        if self.mpi and self.on != "container":
            raise ValueError("an mpi step runs in the head container; remove 'on: host'")
        if self.mpi and self.hosts not in ("all", "head"):
            raise ValueError("an mpi step runs once on the head container; remove 'hosts'")
        return self


class Suite(Model):
    name: str = Field(description="The suite's name (it names the run directory)")
    description: str = Field(default="", description="One line saying what it checks")
    steps: list[Step] = Field(min_length=1, description="The steps, run in order")
    source: str | None = Field(
        default=None,
        description="Set by the loader: the file this was loaded from",
        json_schema_extra=SET_BY_LOADER,
    )

    @field_validator("name")
    @classmethod
    def _suite_name(cls, v: str) -> str:
        # The name becomes a directory under runs/: one path component, never `..`.
        if not SUITE_NAME_RE.fullmatch(v):
            raise ValueError(
                f"invalid suite name {v!r} (letters, digits, '_', '.', '-'; at most 128; "
                "one path component: it names the run directory)"
            )
        return v

    @model_validator(mode="after")
    def _unique_steps(self) -> Suite:
        seen: set[str] = set()
        for step in self.steps:
            if step.name in seen:
                raise ValueError(f"duplicate step name {step.name!r}")
            seen.add(step.name)
        return self


# ---- loading ------------------------------------------------------------------


def _step_label(data: Any, path: list[Any]) -> str:
    # `steps[2]` alone makes the reader count; name the step when it has one.
    if len(path) >= 2 and path[0] == "steps" and isinstance(path[1], int):
        steps = data.get("steps") if isinstance(data, dict) else None
        if isinstance(steps, list) and 0 <= path[1] < len(steps):
            step = steps[path[1]]
            if isinstance(step, dict) and isinstance(step.get("name"), str):
                return f" (step {step['name']!r})"
    return ""


def _on_key_fix(data: dict[Any, Any]) -> None:
    """YAML 1.1 reads the key `on` as the boolean true; give steps their `on:` back.

    In place, moving the recorded position along, so errors still point at the line.
    """
    steps = data.get("steps")
    if not isinstance(steps, list):
        return
    for step in steps:
        if isinstance(step, dict) and True in step and "on" not in step:
            step["on"] = step.pop(True)
            marks = getattr(step, "key_marks", None)
            if marks is not None and True in marks:
                marks["on"] = marks.pop(True)


def suite_from_data(data: Any, source: str) -> Suite:
    """Validate an already-parsed suite document; `source` names it in messages."""
    if not isinstance(data, dict):
        got = "an empty file" if data is None else describe_value(data)
        raise ConfigError(f"{source}: expected a mapping with 'name' and 'steps', got {got}")
    if "source" in data:
        raise ConfigError(f"{source}: source: is set by the loader; remove it")
    _on_key_fix(data)
    located = Located(source, data)
    try:
        return Suite.model_validate({**data, "source": source})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        lines = validation_lines(errors, located, lambda path: path, Suite)
        lines[0] += _step_label(data, list(errors[0]["loc"]))
        more = len(lines) - 1
        suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
        raise ConfigError(lines[0] + suffix) from None


def parse_suite(text: str, source: str) -> Suite:
    """Parse suite YAML text. Raises ConfigError only, with a one-line message."""
    try:
        data = yaml.load(text, Loader=MarkingLoader)
    except yaml.YAMLError as exc:
        raise yaml_error(source, exc, text) from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    return suite_from_data(data, source)


def load_suite(path: str | Path | Traversable) -> Suite:
    source = str(path)
    text = read_document_text(source if isinstance(path, str | Path) else path, "suite file")
    return parse_suite(text, source)


# ---- lookup -------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteRef:
    """A suite file found by name: where it is and which search location found it."""

    name: str
    path: Path | Traversable
    origin: Origin


def search_locations(
    cwd: Path | None = None, env: dict[str, str] | None = None
) -> list[tuple[Origin, Path | Traversable]]:
    """Where names are looked up, in order."""
    env = dict(os.environ) if env is None else env
    out: list[tuple[Origin, Path | Traversable]] = [("./suites", (cwd or Path.cwd()) / "suites")]
    for part in env.get(SUITES_PATH_ENV, "").split(os.pathsep):
        if part.strip():
            out.append(("$CVS_SUITES_PATH", Path(os.path.expanduser(part))))
    out.append(("shipped", resources.files(SHIPPED_PACKAGE)))
    return out


def _suite_files(directory: Path | Traversable) -> list[tuple[str, Path | Traversable]]:
    try:
        if not directory.is_dir():
            return []
        entries = sorted(directory.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    out = []
    for entry in entries:
        stem, dot, ext = entry.name.rpartition(".")
        if dot and f".{ext}" in SUITE_SUFFIXES and stem and entry.is_file():
            out.append((stem, entry))
    return out


def looks_like_path(arg: str) -> bool:
    return os.sep in arg or "/" in arg or arg.endswith(SUITE_SUFFIXES)


def find_suite(
    name_or_path: str, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> SuiteRef:
    """Resolve a suite name (or path) to its file; ConfigError naming every place looked."""
    if looks_like_path(name_or_path):
        path = Path(os.path.expanduser(name_or_path))
        if not path.is_absolute() and cwd is not None:
            path = cwd / path
        if not path.is_file():
            raise ConfigError(f"suite file {name_or_path!r}: no such file")
        return SuiteRef(path.stem, path, "path")
    locations = search_locations(cwd, env)
    for origin, directory in locations:
        for stem, entry in _suite_files(directory):
            if stem == name_or_path:
                return SuiteRef(stem, entry, origin)
    looked = ", ".join(
        f"{directory} ({origin})" if origin != "shipped" else "the shipped examples"
        for origin, directory in locations
    )
    known = sorted({ref.name for ref in list_suites(cwd=cwd, env=env)})
    close = difflib.get_close_matches(name_or_path, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown suite {name_or_path!r}: looked in {looked}{hint}")


def list_suites(*, cwd: Path | None = None, env: dict[str, str] | None = None) -> list[SuiteRef]:
    """Every suite file found, in lookup order (a later one of the same name is shadowed)."""
    return [
        SuiteRef(stem, entry, origin)
        for origin, directory in search_locations(cwd, env)
        for stem, entry in _suite_files(directory)
    ]
