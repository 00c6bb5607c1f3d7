"""The one error type the sandbox raises for problems a user can act on."""


class SandboxError(Exception):
    """`str()` is one line for the user (the CLI prints it and exits 2)."""
