"""The one error type the sandbox raises for problems a user can act on
(defined with every other in orchestrator/errors.py)."""

from orchestrator.errors import SandboxError as SandboxError
