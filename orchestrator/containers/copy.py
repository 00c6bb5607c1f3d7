"""Files to every host (and back), over the connections already open.

    payload = Payload.from_path(Path("rccl-tests.tar.gz"))
    results = await copy_to_hosts(pool, cluster, payload, "/opt/", hosts=[...])

A file is streamed as is; a directory as one tar stream built once. Each
host's copy goes over a new channel of that host's SSH connection into
`docker exec -i CONTAINER sh -c ...` (or a shell on the host with
`host_os`), or, where the container runs its sshd and `ssh_exec` takes it
(containers/sshexec.py decides, as for `exec`: same user, environment and
working directory), over a channel of the connection to that sshd. It
lands under DEST the way `cp -r` would put it (inside DEST when DEST is a
directory or ends with `/`, else as DEST), whole or not at all: the
remote side (remote/copy_receive.sh) gives nothing its final name before it
arrived complete and matches its sha256, and removes its temp names on every
exit (cvs killed or interrupted: the channel closes). It then prints the
sha256 of every file it wrote, compared with the local ones. A file that
differs fails that host.

`gather_from_hosts` does the reverse for one file per host, into
`DIR/<host>/<name>`, checked the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shlex
import stat
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import anyio

from orchestrator import remote
from orchestrator.config import ClusterConfig, container_name
from orchestrator.containers.exec import container_command, in_running_container
from orchestrator.containers.route import RuntimeExec, Sshd
from orchestrator.errors import ConnectError
from orchestrator.remote.runtime import ContainerRuntime
from orchestrator.results import HostResult
from orchestrator.ssh.fanout import fan_out
from orchestrator.ssh.libsearch import asyncssh
from orchestrator.ssh.seam import HeldRequest, HostRunner

if TYPE_CHECKING:
    from orchestrator.containers.sshexec import SSHExec

CHUNK = 256 * 1024
# The line the remote side prints before its checksums: where the copy went.
FINAL_MARK = "@@cvs-final:"

Progress = Callable[[str, int], None]  # (host, bytes just sent or received)


class CopyError(ValueError):
    """A local source cannot be copied (missing, unreadable, an odd name). One line."""


def in_container(
    name: str,
    argv: Sequence[str],
    *,
    tty: bool = False,
    runtime: ContainerRuntime | None = None,
    host: str = "",
    advice: str = "",
) -> str:
    """Host shell text running `argv` in container `name` with stdin attached
    (and a terminal with `tty`, for `cvs shell`); `host` names it when the
    container is not running."""
    args = ["exec", "-i", *(["-t"] if tty else []), name, *argv]
    return in_running_container(name, args, runtime, host=host, advice=advice)


def cluster_runtime(cluster: ClusterConfig) -> ContainerRuntime:
    """The cluster's runtime on a host no probe of this invocation has seen."""
    cfg = cluster.container
    if cfg is None:
        return ContainerRuntime()
    return ContainerRuntime.unprobed(cfg.runtime, cfg.rootless)


def _check_name(path: Path, root: Path) -> None:
    # sha256sum escapes names with a newline or backslash; such names would never match.
    text = str(path)
    if "\n" in text or "\\" in text:
        raise CopyError(f"{root}: cannot copy {text!r}: newline or backslash in the name")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Payload:
    """What is sent: the bytes (a file, or a tar of a directory) and the expected checksums."""

    source: Path
    kind: str  # "file" | "dir"
    stream: IO[bytes]
    size: int
    mode: str
    # Relative path ("./a/b" for directories, "-" for a file) -> sha256.
    checksums: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_path(cls, source: Path) -> Payload:
        try:
            st = source.stat()
        except OSError as exc:
            raise CopyError(f"{source}: {exc.strerror or exc}") from None
        if stat.S_ISREG(st.st_mode):
            try:
                stream: IO[bytes] = source.open("rb")
            except OSError as exc:
                raise CopyError(f"{source}: {exc.strerror or exc}") from None
            mode = format(stat.S_IMODE(st.st_mode), "o")
            return cls(source, "file", stream, st.st_size, mode, {"-": _sha256_file(source)})
        if stat.S_ISDIR(st.st_mode):
            return cls._from_directory(source)
        raise CopyError(f"{source}: not a regular file or directory")

    @classmethod
    def _from_directory(cls, source: Path) -> Payload:
        """The tree under `./d/`, then the manifest `./sha256` (sha256sum's
        lines), last: the receiving side (remote/copy_receive.sh) moves nothing
        to its final name unless the manifest arrived and every file matches."""
        checksums: dict[str, str] = {}
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - closed by Payload.close
        try:
            with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as tar:
                tar.addfile(_member("./d", tarfile.DIRTYPE, 0o755))
                for path in _walk(source):
                    rel = path.relative_to(source)
                    _check_name(rel, source)
                    tar.add(path, arcname=f"./d/{rel}", recursive=False)
                    if path.is_file() and not path.is_symlink():
                        checksums[f"./{rel}"] = _sha256_file(path)
                manifest = "".join(f"{h}  {p}\n" for p, h in checksums.items()).encode()
                info = _member("./sha256", tarfile.REGTYPE, 0o644)
                info.size = len(manifest)
                tar.addfile(info, io.BytesIO(manifest))
        except OSError as exc:
            spool.close()
            raise CopyError(f"{source}: {exc.strerror or exc}") from None
        size = spool.tell()
        spool.seek(0)
        return cls(source, "dir", spool, size, "755", checksums)

    def chunks(self) -> list[tuple[int, int]]:
        """(offset, length) of each chunk; every host reads the same spool by offset."""
        return [(o, min(CHUNK, self.size - o)) for o in range(0, self.size, CHUNK)]

    def read(self, offset: int, length: int) -> bytes:
        # One spool, read by many hosts at once: pread does not move a shared position.
        return os.pread(self.stream.fileno(), length, offset)

    def close(self) -> None:
        self.stream.close()


def _member(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, int(time.time())
    return info


def _walk(source: Path) -> list[Path]:
    """Everything under `source` (not following links), in a stable order:
    each directory's subdirectories, then its files, by name."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames.sort()
        here = Path(dirpath)
        out += [here / name for name in [*dirnames, *sorted(filenames)]]
    return out


def compare(expected: dict[str, str], remote_lines: list[str], kind: str) -> str | None:
    """None when every expected file's remote sha256 matches, else one line saying which not."""
    got: dict[str, str] = {}
    for line in remote_lines:
        digest, _, name = line.partition("  ")
        if len(digest) == 64:
            got[name.strip() if kind == "dir" else "-"] = digest
    missing = [p for p in expected if p not in got]
    differs = [p for p in expected if p in got and got[p] != expected[p]]
    if not missing and not differs:
        return None
    parts = []
    if differs:
        parts.append(f"sha256 differs for {', '.join(differs[:3])}")
    if missing:
        parts.append(f"not found after the copy: {', '.join(missing[:3])}")
    more = len(missing) + len(differs) - min(3, len(differs)) - min(3, len(missing))
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def _wrap(
    cluster: ClusterConfig,
    argv: list[str],
    host_os: bool,
    runtime: ContainerRuntime | None = None,
    *,
    host: str = "",
) -> str:
    if host_os or cluster.container is None:
        return shlex.join(argv)
    name = container_name(cluster)
    return in_container(name, argv, runtime=runtime or cluster_runtime(cluster), host=host)


def _stoppable(
    cluster: ClusterConfig, argv: list[str], host_os: bool, *, host: str = ""
) -> tuple[str, str | None]:
    """(host shell text running `argv` where the copy's end runs, the text
    that stops it there or None): in a container, under run.sh, whose pid
    kill_tree.sh ends (remote/run.sh; containers/exec.py)."""
    if host_os or cluster.container is None:
        return shlex.join(argv), None
    runtime = cluster_runtime(cluster)
    command = container_command(
        container_name(cluster), argv, runtime=runtime, stdin=True, host=host
    )
    return command.script, command.kill


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _not_done(host: str, start: float, exc: BaseException, timeout: float) -> HostResult:
    """The result of a copy that did not finish: never connected, timed out, or cut off."""
    seconds = time.monotonic() - start
    if isinstance(exc, ConnectError):
        return HostResult(host, exc.status, duration=seconds, error=exc.message)
    if isinstance(exc, TimeoutError):
        return HostResult(host, "timeout", duration=seconds, error=f"timed out after {timeout:g}s")
    return HostResult(host, "unreachable", duration=seconds, error=f"connection lost: {exc}")


async def _send(process: Any, host: str, payload: Payload, progress: Progress | None) -> None:
    """Stream the payload into the remote side's stdin, then EOF.

    The remote side may stop reading early (DEST cannot be created, disk full):
    the channel's stdin then closes under us. That is not a lost connection:
    stop sending and let the exit status and stderr say what happened.
    """
    try:
        for offset, length in payload.chunks():
            process.stdin.write(payload.read(offset, length))
            await process.stdin.drain()
            if progress is not None:
                progress(host, length)
        process.stdin.write_eof()
    except (BrokenPipeError, ConnectionResetError, asyncssh.Error):
        return


# Opens the remote end of one host's copy into the stack (closed with it):
# an asyncssh process streaming bytes.
Opener = Callable[[contextlib.AsyncExitStack[Any]], Awaitable[Any]]


def _opener(
    pool: HostRunner,
    host: str,
    script: str,
    argv: Sequence[str],
    ssh_exec: SSHExec | None,
    runtime: ContainerRuntime,
    kill: str | None = None,
) -> Opener:
    """The copy's remote end: `argv` in the container through its sshd when
    `ssh_exec` routes it there (containers/route.py decides, as for `exec`), else
    `script` (`docker exec -i ...`, or the host's shell) on a host channel.
    `kill`: host shell text that ends what `script` started in the container,
    run when the copy's block ends before the process did (closing the
    channel ends the `docker exec` client, never what it started)."""

    async def open_(stack: contextlib.AsyncExitStack[Any]) -> Any:
        if ssh_exec is not None:
            way = await ssh_exec.route(host, runtime, None)
            if isinstance(way, Sshd):
                process = await ssh_exec.held_process(stack, way, host, argv, runtime=runtime)
                if not isinstance(process, RuntimeExec):
                    return process
        return await stack.enter_async_context(
            pool.held_process(host, HeldRequest(script, encoding=None, on_end=kill))
        )

    return open_


async def _copy_one(
    open_: Opener,
    host: str,
    payload: Payload,
    timeout: float,
    progress: Progress | None,
) -> HostResult:
    start = time.monotonic()
    try:
        async with contextlib.AsyncExitStack() as stack:
            process = await open_(stack)
            with anyio.fail_after(timeout):
                await _send(process, host, payload, progress)
                stdout = await process.stdout.read()
                stderr = await process.stderr.read()
                done = await process.wait()
    except (ConnectError, TimeoutError, OSError, asyncssh.Error) as exc:
        return _not_done(host, start, exc, timeout)
    out = stdout.decode("utf-8", "replace")
    err = stderr.decode("utf-8", "replace").strip()
    seconds = time.monotonic() - start
    if done.exit_status != 0:
        return HostResult(
            host,
            "failed",
            exit_code=done.exit_status,
            stderr=err,
            duration=seconds,
            error=(err.splitlines() or [f"exit code {done.exit_status}"])[-1],
        )
    lines = out.splitlines()
    final = next((x[len(FINAL_MARK) :] for x in lines if x.startswith(FINAL_MARK)), "?")
    problem = compare(payload.checksums, lines, payload.kind)
    if problem is not None:
        return HostResult(
            host, "failed", exit_code=0, stdout=out, duration=seconds, error=f"{final}: {problem}"
        )
    files = len(payload.checksums)
    summary = f"{final}: {files} file{'s' if files != 1 else ''}, {_human(payload.size)}, sha256 ok"
    return HostResult(host, "ok", exit_code=0, stdout=summary, duration=seconds)


async def copy_to_hosts(
    pool: HostRunner,
    cluster: ClusterConfig,
    payload: Payload,
    dest: str,
    *,
    hosts: Sequence[str],
    host_os: bool = False,
    timeout: float | None = None,
    progress: Progress | None = None,
    runtimes: Mapping[str, ContainerRuntime] | None = None,
    ssh_exec: SSHExec | None = None,
) -> dict[str, HostResult]:
    """Copy `payload` to `dest` on every host at once (into the container unless
    `host_os`). `runtimes`: how to reach docker on hosts whose container this
    invocation's `up` probed (no running check there). `ssh_exec`: the
    containers' sshd path, taken where it runs (else `docker exec -i`)."""
    if not dest or "\n" in dest or "\0" in dest:
        raise CopyError(f"bad destination {dest!r}")
    want = payload.checksums.get("-", "")
    argv = remote.argv("copy_receive", dest, payload.source.name, payload.kind)
    argv += [payload.mode, want]
    limit = timeout if timeout is not None else cluster.ssh.command_timeout
    known = runtimes or {}
    via = None if host_os or cluster.container is None else ssh_exec

    async def one(host: str) -> HostResult:
        runtime = known.get(host) or cluster_runtime(cluster)
        script = _wrap(cluster, argv, host_os, runtime, host=host)
        open_ = _opener(pool, host, script, argv, via, runtime)
        return await _copy_one(open_, host, payload, limit, progress)

    return await fan_out(list(hosts), one, limit=cluster.concurrency.hosts)


async def _receive(
    process: Any, out: IO[bytes], digest: Any, host: str, progress: Progress | None
) -> None:
    """The process's stdout into `out` and `digest`, chunk by chunk."""
    while chunk := await process.stdout.read(CHUNK):
        out.write(chunk)
        digest.update(chunk)
        if progress is not None:
            progress(host, len(chunk))


async def _gather_one(
    open_: Opener,
    host: str,
    target: Path,
    timeout: float,
    progress: Progress | None,
) -> HostResult:
    # A host directory this copy makes goes again when the copy fails: a
    # missing file must not leave an empty DEST/<host>/ that reads as a result.
    made = not target.parent.exists()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.part")
    try:
        result = await _gather_into(open_, host, target, partial, timeout, progress)
    finally:
        if made and not target.exists():
            partial.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                target.parent.rmdir()
    return result


async def _gather_into(
    open_: Opener,
    host: str,
    target: Path,
    partial: Path,
    timeout: float,
    progress: Progress | None,
) -> HostResult:
    start = time.monotonic()
    digest = hashlib.sha256()
    try:
        async with contextlib.AsyncExitStack() as stack:
            process = await open_(stack)
            process.stdin.write_eof()
            with anyio.fail_after(timeout), partial.open("wb") as out:
                await _receive(process, out, digest, host, progress)
                stderr = (await process.stderr.read()).decode("utf-8", "replace")
                done = await process.wait()
    except (ConnectError, TimeoutError, OSError, asyncssh.Error) as exc:
        partial.unlink(missing_ok=True)
        return _not_done(host, start, exc, timeout)
    seconds = time.monotonic() - start
    if done.exit_status != 0:
        partial.unlink(missing_ok=True)
        err = stderr.strip()
        return HostResult(
            host,
            "failed",
            exit_code=done.exit_status,
            stderr=err,
            duration=seconds,
            error=(err.splitlines() or [f"exit code {done.exit_status}"])[-1],
        )
    remote = stderr.split()[0] if stderr.split() else ""
    if remote != digest.hexdigest():
        partial.unlink(missing_ok=True)
        return HostResult(host, "failed", exit_code=0, duration=seconds, error="sha256 differs")
    os.replace(partial, target)
    size = target.stat().st_size
    return HostResult(
        host, "ok", exit_code=0, stdout=f"{target}: {_human(size)}, sha256 ok", duration=seconds
    )


async def gather_from_hosts(
    pool: HostRunner,
    cluster: ClusterConfig,
    src: str,
    dest_dir: Path,
    *,
    hosts: Sequence[str],
    host_os: bool = False,
    timeout: float | None = None,
    progress: Progress | None = None,
    ssh_exec: SSHExec | None = None,
) -> dict[str, HostResult]:
    """Fetch the file `src` from every host into `dest_dir/<host>/<name of src>`
    (`ssh_exec`: as for `copy_to_hosts`)."""
    name = os.path.basename(src.rstrip("/"))
    if not name or name in (".", "..") or "\n" in src or "\0" in src:
        raise CopyError(f"cannot fetch {src!r}: it does not name a file")
    send = remote.argv("copy_send", src)
    limit = timeout if timeout is not None else cluster.ssh.command_timeout
    via = None if host_os or cluster.container is None else ssh_exec
    runtime = cluster_runtime(cluster)

    async def one(host: str) -> HostResult:
        # The send reads the whole file (sha256sum, then cat) and never reads
        # its stdin: a gather cut short has it ended (`kill`), not left reading.
        script, kill = _stoppable(cluster, send, host_os, host=host)
        open_ = _opener(pool, host, script, send, via, runtime, kill)
        return await _gather_one(open_, host, dest_dir / host / name, limit, progress)

    return await fan_out(list(hosts), one, limit=cluster.concurrency.hosts)
