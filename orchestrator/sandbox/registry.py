"""A container registry for the sandbox: Debian's `docker-registry` (the
distribution registry), on the coordinator's side, with htpasswd auth.

It listens on the sandbox bridge's address (10.201.K.254), which every
sandbox host reaches (the netns hosts through their veth, the egress host
directly), over plain HTTP: each sandbox dockerd lists 10.201.0.0/16 as an
insecure registry (daemons.write_dockerd_config). Its files live under the
sandbox's run dir, so `cvs sandbox down` stops it even after a crash (every
process mentioning the run dir is ours).
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import network, procs
from .errors import SandboxError

REGISTRY_BINARY = "docker-registry"
REGISTRY_USER = "cvsbot"


@dataclass(frozen=True)
class SandboxRegistry:
    address: str  # host:port, as image references name it
    username: str
    password: str
    # Readable by the sandbox's login users: what `registry.password_file` names.
    password_file: Path
    pid: int
    directory: Path

    def ref(self, repository: str, tag: str) -> str:
        return f"{self.address}/{repository}:{tag}"


def _bcrypt(password: str) -> str:
    # The registry's htpasswd accepts bcrypt only; glibc's libxcrypt makes it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _answers(address: str, port: int) -> bool:
    """GET /v2/ answers 401 once the registry serves (auth is on)."""
    try:
        with socket.create_connection((address, port), timeout=1.0) as sock:
            sock.sendall(b"GET /v2/ HTTP/1.0\r\nHost: registry\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.")
    except OSError:
        return False


@contextlib.contextmanager
def sandbox_registry(index: int, run_dir: Path) -> Iterator[SandboxRegistry]:
    """Start a registry for sandbox `index` (files under `run_dir`), stop it after."""
    if shutil.which(REGISTRY_BINARY) is None:
        raise SandboxError(
            f"{REGISTRY_BINARY} is not installed: apt-get install docker-registry "
            "(.ci/bootstrap installs it)"
        )
    address = network.gateway_address(index)
    port = _free_port(address)
    directory = run_dir / f"registry-{port}"
    directory.mkdir(parents=True)
    password = secrets.token_urlsafe(18)
    (directory / "htpasswd").write_text(f"{REGISTRY_USER}:{_bcrypt(password)}\n")
    password_file = directory / "password"
    password_file.write_text(password + "\n")
    # The hosts' login users read it (docker login < file); nobody else needs to.
    password_file.chmod(0o644)
    config = directory / "config.yml"
    config.write_text(
        "\n".join(
            [
                "version: 0.1",
                "log: {level: warn}",
                f"storage: {{filesystem: {{rootdirectory: {directory / 'data'}}}, "
                "delete: {enabled: true}}",
                f"http: {{addr: '{address}:{port}', secret: {secrets.token_hex(16)}}}",
                f"auth: {{htpasswd: {{realm: cvs-sandbox, path: {directory / 'htpasswd'}}}}}",
                "",
            ]
        )
    )
    pid = procs.spawn([REGISTRY_BINARY, "serve", str(config)], directory / "registry.log")
    marker = str(config)
    try:
        procs.wait_for(
            lambda: _answers(address, port) or not procs.alive(pid),
            timeout=30,
            what="the sandbox registry",
        )
        if not procs.alive(pid):
            log = (directory / "registry.log").read_text(errors="replace")[-500:]
            raise SandboxError(f"the sandbox registry exited: {log}")
        yield SandboxRegistry(
            address=f"{address}:{port}",
            username=REGISTRY_USER,
            password=password,
            password_file=password_file,
            pid=pid,
            directory=directory,
        )
    finally:
        procs.stop(pid, marker, timeout=10)
        shutil.rmtree(directory, ignore_errors=True)
