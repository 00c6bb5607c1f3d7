"""Local multi-host sandbox cluster: one netns + sshd + dockerd per host.

Used by the test suite, the README's set-up and tour, and the benchmarks; the CLI
wraps it as `cvs sandbox up|down`.
"""

from .core import Sandbox, SandboxHost, load_sandbox, sandbox_down, sandbox_up
from .errors import SandboxError
from .images import BASE_TAG, IMAGE_USER, SSHD_TAG, USER_TAG, ensure_user_image
from .users import DOCKER_USER, NO_DOCKER_USER, SUDO_USER

__all__ = [
    "BASE_TAG",
    "DOCKER_USER",
    "IMAGE_USER",
    "NO_DOCKER_USER",
    "SSHD_TAG",
    "SUDO_USER",
    "USER_TAG",
    "Sandbox",
    "SandboxError",
    "SandboxHost",
    "ensure_user_image",
    "load_sandbox",
    "sandbox_down",
    "sandbox_up",
]
