"""Quiet by default under CVS's logging: the SSH library's chatter at debug level.

CVS's `pytest.ini` turns on live logging (`log_cli = true`) with the root
logger at INFO, so everything asyncssh logs at INFO (every connection,
channel and the full text of each command our lock, probe and provisioning
programs send) would reach the console, thousands of lines for one cold
start. Once our engine is in use, asyncssh's records are handed on as DEBUG
records of the logger `cvs_orchestrator.ssh`: in the run's log file when
it records debug (`--log-file-level=debug`), never on the console at INFO.
Warnings and errors keep their level.
"""

from __future__ import annotations

import logging

SSH_LIBRARY_LOGGER = "asyncssh"
DEMOTED_LOGGER = "cvs_orchestrator.ssh"


class _Demote(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger(DEMOTED_LOGGER)
        if record.levelno < logging.WARNING:
            if not target.isEnabledFor(logging.DEBUG):
                return
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.name = DEMOTED_LOGGER
        target.handle(record)


def quiet_ssh_library() -> None:
    """Route asyncssh's logging through `cvs_orchestrator.ssh`, INFO as DEBUG (once)."""
    source = logging.getLogger(SSH_LIBRARY_LOGGER)
    if any(isinstance(h, _Demote) for h in source.handlers):
        return
    source.addHandler(_Demote())
    source.propagate = False
