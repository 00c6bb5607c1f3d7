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

import base64
import contextlib
import json
import secrets
import shutil
import socket
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    # crypt is imported here, when a registry is built: Python 3.13 has no
    # crypt module, and the fast subset imports this module there (its
    # deprecation warning since 3.11 is silenced where it is imported).
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


def _write_files(directory: Path, listen: str, data: Path) -> tuple[str, Path, Path]:
    """htpasswd, password file and config.yml in `directory` (created); the
    registry listens on `listen` (host:port) and stores under `data`.
    Returns (password, password file, config)."""
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
                f"storage: {{filesystem: {{rootdirectory: {data}}}, delete: {{enabled: true}}}}",
                f"http: {{addr: '{listen}', secret: {secrets.token_hex(16)}}}",
                f"auth: {{htpasswd: {{realm: cvs-sandbox, path: {directory / 'htpasswd'}}}}}",
                "",
            ]
        )
    )
    return password, password_file, config


def _serve(prefix: list[str], config: Path, address: str, port: int) -> int:
    """Start the registry (`prefix` + its argv) and wait until it answers;
    stopped again if it does not. Returns its pid (the command's: every
    prefix used here execs)."""
    directory = config.parent
    pid = procs.spawn([*prefix, REGISTRY_BINARY, "serve", str(config)], directory / "registry.log")
    try:
        procs.wait_for(
            lambda: _answers(address, port) or not procs.alive(pid),
            timeout=30,
            what="the sandbox registry",
        )
        if not procs.alive(pid):
            log = (directory / "registry.log").read_text(errors="replace")[-500:]
            raise SandboxError(f"the sandbox registry exited: {log}")
    except BaseException:
        procs.stop(pid, str(config), timeout=10)
        raise
    return pid


def _require_binary() -> None:
    if shutil.which(REGISTRY_BINARY) is None:
        raise SandboxError(
            f"{REGISTRY_BINARY} is not installed: apt-get install docker-registry "
            "(.ci/bootstrap installs it)"
        )


@contextlib.contextmanager
def sandbox_registry(index: int, run_dir: Path) -> Iterator[SandboxRegistry]:
    """Start a registry for sandbox `index` (files under `run_dir`), stop it after."""
    _require_binary()
    address = network.gateway_address(index)
    port = _free_port(address)
    directory = run_dir / f"registry-{port}"
    try:
        password, password_file, config = _write_files(
            directory, f"{address}:{port}", directory / "data"
        )
        pid = _serve([], config, address, port)
        try:
            yield SandboxRegistry(
                address=f"{address}:{port}",
                username=REGISTRY_USER,
                password=password,
                password_file=password_file,
                pid=pid,
                directory=directory,
            )
        finally:
            procs.stop(pid, str(config), timeout=10)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# The shaped registry's port: the namespace is its own, nothing else listens there.
NETNS_REGISTRY_PORT = 5000


def netns_registry_dir(run_dir: Path) -> Path:
    """Its config, htpasswd, password and log: under the sandbox's run dir
    (which the login users traverse, and which `sandbox down` sweeps for
    processes mentioning it)."""
    return run_dir / "registry"


def start_netns_registry(index: int, run_dir: Path, data: Path) -> SandboxRegistry:
    """The registry of `cvs sandbox up --registry`, in its own namespace
    (network.create_registry_netns, made before), storing under `data`.
    It lives as long as the sandbox: `sandbox_down` stops it."""
    _require_binary()
    address = network.registry_address(index)
    directory = netns_registry_dir(run_dir)
    password, password_file, config = _write_files(
        directory, f"{address}:{NETNS_REGISTRY_PORT}", data
    )
    # `ip netns exec` execs the registry: the pid spawned is the registry's.
    prefix = ["ip", "netns", "exec", network.registry_netns_name(index)]
    pid = _serve(prefix, config, address, NETNS_REGISTRY_PORT)
    return SandboxRegistry(
        address=f"{address}:{NETNS_REGISTRY_PORT}",
        username=REGISTRY_USER,
        password=password,
        password_file=password_file,
        pid=pid,
        directory=directory,
    )


def stop_netns_registry(pid: int | None, run_dir: Path) -> str:
    """Stop it by pid, only while its command line still names its config."""
    return procs.stop(pid, str(netns_registry_dir(run_dir) / "config.yml"), timeout=10)


def docker_config(registry: SandboxRegistry) -> str:
    """A docker CLI config.json logged in to `registry` (written to a
    DOCKER_CONFIG directory of our own: no `docker login` argv, and the
    machine's ~/.docker stays as it was)."""
    token = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    return json.dumps({"auths": {registry.address: {"auth": token}}}) + "\n"


MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    ]
)


def _manifest(reference: str, username: str, password: str, timeout: float) -> dict[str, Any]:
    """The registry's manifest of `reference` (host:port/repository:tag)."""
    server, _, rest = reference.partition("/")
    repository, _, tag = rest.rpartition(":")
    request = urllib.request.Request(
        f"http://{server}/v2/{repository}/manifests/{tag}",
        headers={
            "Accept": MANIFEST_TYPES,
            "Authorization": "Basic "
            + base64.b64encode(f"{username}:{password}".encode()).decode(),
        },
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        manifest: dict[str, Any] = json.loads(answer.read(1 << 20))
    return manifest


def image_bytes(reference: str, username: str, password: str, timeout: float = 30.0) -> int:
    """What pulling `reference` (host:port/repository:tag, on a sandbox
    registry) moves: its config's and layers' sizes as the registry's
    manifest states them (the compressed size S)."""
    manifest = _manifest(reference, username, password, timeout)
    return int(manifest["config"]["size"]) + sum(int(x["size"]) for x in manifest["layers"])


def config_digest(reference: str, username: str, password: str, timeout: float = 30.0) -> str:
    """The image ID the registry names for `reference`: its config's digest
    (sha256:...), which a pull, and a spread, must end with on every host."""
    return str(_manifest(reference, username, password, timeout)["config"]["digest"])
