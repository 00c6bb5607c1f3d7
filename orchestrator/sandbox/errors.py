"""The one error type the sandbox raises for problems a user can act on."""

from orchestrator.errors import UsageError


class SandboxError(UsageError):
    """`str()` is one line for the user (the CLI prints it and exits 2)."""
