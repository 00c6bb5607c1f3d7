"""Local multi-host sandbox cluster: one netns + sshd + dockerd per host.

Used by the test suite, the README's quick start and the benchmarks; the CLI
wraps it as `cvs sandbox up|down`.
"""

from .core import Sandbox, SandboxHost, load_sandbox, sandbox_down, sandbox_up
from .errors import SandboxError
from .images import BASE_TAG, SSHD_TAG
from .users import DOCKER_USER, NO_DOCKER_USER, SUDO_USER

__all__ = [
    "BASE_TAG",
    "DOCKER_USER",
    "NO_DOCKER_USER",
    "SSHD_TAG",
    "SUDO_USER",
    "Sandbox",
    "SandboxError",
    "SandboxHost",
    "load_sandbox",
    "sandbox_down",
    "sandbox_up",
]
