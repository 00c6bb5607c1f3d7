"""Quiet by default under CVS's logging: the SSH library's chatter at debug level.

CVS's `pytest.ini` turns on live logging (`log_cli = true`) with the root
logger at INFO, so everything asyncssh logs at INFO (every connection,
channel and the full text of each command our lock, probe and provisioning
programs send) would reach the console, thousands of lines for one cold
start. Once our engine is in use, asyncssh's records below WARNING are
handed on as DEBUG records of the logger `cvs_orchestrator.ssh`: in the
run's log file when it records debug (`--log-file-level=debug`), never on the
console at INFO. Warnings and errors keep their level and their logger.

A filter on asyncssh's loggers, not `propagate = False`: pytest attaches its
capture handlers to every non-propagating logger too (CVS's cvs/lib/globals.py
does the same for parallel-ssh's host logger, for the same reason).
"""

from __future__ import annotations

import logging

# asyncssh logs to its package logger, and to one child for SFTP.
SSH_LIBRARY_LOGGERS = ("asyncssh", "asyncssh.sftp")
DEMOTED_LOGGER = "cvs_orchestrator.ssh"


def _demote_ssh_library_record(record: logging.LogRecord) -> bool:
    """Keep warnings and errors as they are; send the rest on as DEBUG."""
    if record.levelno >= logging.WARNING:
        return True
    target = logging.getLogger(DEMOTED_LOGGER)
    if target.isEnabledFor(logging.DEBUG):
        demoted = logging.makeLogRecord(record.__dict__)
        demoted.levelno, demoted.levelname, demoted.name = logging.DEBUG, "DEBUG", DEMOTED_LOGGER
        target.handle(demoted)
    return False


def quiet_ssh_library() -> None:
    """Install the demotion on asyncssh's loggers (once)."""
    for name in SSH_LIBRARY_LOGGERS:
        source = logging.getLogger(name)
        if _demote_ssh_library_record not in source.filters:
            source.addFilter(_demote_ssh_library_record)
