"""`cvs`: the command line. Thin: parse, load, call the API, render.

One module per command group (cluster, run, sandbox), shared helpers in
`common`, the parser in `parser`; no command module imports another. Errors
become messages and exit codes in one place: `main` (codes: errors.ExitCode).

This module is one of the few boundaries where imports are lazy
(tests/test_code_shape.py): a command's module is imported only once it is
chosen (`args.func`, "module:function"), and `cli.common` (the config model,
pydantic) only on the error paths, so `cvs --help` loads neither.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import importlib
import json
import os
import shlex
import signal
import sys
from collections.abc import Sequence

from orchestrator.cli import collector, cvs_cli
from orchestrator.cli.parser import build_parser
from orchestrator.cli.writer import BackgroundWriter
from orchestrator.errors import CvsError, ExitCode, PolicyRefused, worst

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run `cvs` with `argv` (default: sys.argv[1:]); returns the exit code.

    Output to a pipe or file goes through a writer thread: a reader that stops
    reading blocks only that thread, never the work, so the hosts' locks are
    released when the work is done, not when the reader catches up.
    """
    # The process's own entry point: no garbage collection during start-up
    # (collector.start); `_main` calls collector.tune before the command runs.
    process_owned = argv is None
    if process_owned:
        collector.start()
    try:
        return _main_with_writers(argv)
    finally:
        if process_owned:
            gc.enable()  # whatever happened before tune(), never left off


def _main_with_writers(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if cvs_cli.cvs_importable() and cvs_cli.wants_cvs_cli(words, _our_commands()):
        cvs_cli.exec_cvs_cli(words)  # does not return
    saved = sys.stdout, sys.stderr
    writers = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not _is_tty(stream):
            writer = BackgroundWriter(stream)
            setattr(sys, name, writer)
            writers.append(writer)
    out = sys.stdout if isinstance(sys.stdout, BackgroundWriter) else None
    said = False
    try:
        return _main(argv)
    except BrokenPipeError:
        if out is None or not out.broken:
            raise
        said = True
        return _stdout_closed()
    finally:
        sys.stdout, sys.stderr = saved
        for writer in writers:
            writer.drain()
        if out is not None and out.broken:
            if not said and not out.told:  # found by the writer, after the command returned
                _stdout_closed()
            _discard_stdout()


def _terminate_as_interrupt() -> None:
    """SIGTERM (scancel, a time limit, `kill`) and SIGHUP (salloc when its job
    is revoked, a closed terminal) stop cvs as Ctrl-C does: the command's own
    clean-up runs (per_run and per_job containers it was starting are
    removed, remote commands stopped) and it exits 130, instead of dying
    with its containers left behind."""

    def interrupt(signum: int, frame: object) -> None:
        # Whatever handles SIGINT now (asyncio's runner cancels its main task
        # and raises KeyboardInterrupt on a second one); the default raises
        # KeyboardInterrupt. SIGINT ignored (a background job of a script):
        # still an interrupt.
        current = signal.getsignal(signal.SIGINT)
        if callable(current):
            current(signal.SIGINT, frame)  # type: ignore[arg-type]
            return
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup: stays ignored
                signal.signal(sig, interrupt)


def _stdout_closed() -> int:
    """Whoever read our stdout went away (`cvs status | head -1`): one line on
    stderr, no traceback, whatever the command (the work itself was done or
    stopped as the command does it; only its output was cut)."""
    with contextlib.suppress(OSError):
        sys.stderr.write("cvs: stdout closed by its reader: the rest of the output was dropped\n")
    return ExitCode.INTERRUPTED


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null: what Python still holds for the closed pipe
    is flushed there at exit instead of printing `Exception ignored`."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _our_commands() -> list[str]:
    """The subcommand names our parser has (and their aliases)."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def _main(argv: Sequence[str] | None = None) -> int:
    # Called as the process's entry point (argv from sys.argv) the process is
    # ours to tune; a caller passing argv in its own process keeps its settings.
    process_owned = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parse(argv)
    except SystemExit as exc:
        # argparse has printed the usage error; --json callers get the result line too.
        if exc.code == 2 and "--json" in argv:
            commands = _our_commands()
            _json_error(next((w for w in argv if w in commands), None), "usage error")
        raise
    _apply_color(getattr(args, "color", None))
    module_name, _, func_name = args.func.partition(":")
    try:
        handler = getattr(importlib.import_module(f"orchestrator.cli.{module_name}"), func_name)
        if process_owned:
            _terminate_as_interrupt()

            collector.import_for(handler)  # what it imports when it runs, too
            collector.tune()  # after the imports: they are frozen, never scanned again
        return int(handler(args))
    except KeyboardInterrupt:
        sys.stderr.write("cvs: interrupted\n")
        if args.json:
            from orchestrator.cli.common import write_json_result

            write_json_result(args, ok=False, exit_code=ExitCode.INTERRUPTED, error="interrupted")
        return ExitCode.INTERRUPTED
    except PolicyRefused as exc:
        from orchestrator.cli.common import print_refusal

        return print_refusal(args, exc)
    except CvsError as exc:
        from orchestrator.cli.common import cli_message

        message = cli_message(exc)
        sys.stderr.write(f"cvs: {message}\n")
        problems = getattr(exc, "problems", [])
        if len(problems) > 1 and (args.verbose or args.command_name == "validate"):
            for line in problems:  # every one, the first again among them
                sys.stderr.write(f"  - {line}\n")
        if args.json:
            from orchestrator.cli.common import write_json_result

            write_json_result(args, ok=False, exit_code=exc.exit_code, error=message)
        return exc.exit_code
    except BaseExceptionGroup as group:
        # A task group (per-host fan-out) wraps what the hosts' tasks raised: the
        # expected errors inside are reported as if raised alone, without a traceback.
        leaves = _leaves(group)
        pipe = next((e for e in leaves if isinstance(e, BrokenPipeError)), None)
        if pipe is not None:
            raise pipe from None  # main() tells a closed stdout from other pipes
        errors = [exc for exc in leaves if isinstance(exc, CvsError)]
        if len(errors) == len(leaves):
            return _report_all(errors, args)
        leaf = _first_expected(group)
        if leaf is None:
            raise
        return _report(leaf, args)
    except BrokenPipeError:
        raise  # main() tells a closed stdout from other pipes
    except OSError as exc:
        return _report(exc, args)


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found


def _report_all(errors: list[CvsError], args: argparse.Namespace) -> int:
    """Several hosts' errors as one report: a line per distinct error, the
    refusals' reasons in one refusal list; the worst exit code of them all."""
    from orchestrator.cli.common import cli_reasons, print_refusal, write_json_result

    refusals = [r for e in errors if isinstance(e, PolicyRefused) for r in e.refusals]
    others = list(dict.fromkeys(str(e) for e in errors if not isinstance(e, PolicyRefused)))
    code = worst(e.exit_code for e in errors)
    refused = PolicyRefused(list(dict.fromkeys(refusals))) if refusals else None
    if args.json:
        fields: dict[str, object] = {}
        if refused is not None:
            reasons = cli_reasons(refused.refusals)
            others.append(f"refused: {'; '.join(reasons)}")
            fields["refused"] = reasons
        write_json_result(args, ok=False, exit_code=code, error="; ".join(others), **fields)
        return code
    for message in others:
        sys.stderr.write(f"cvs: {message}\n")
    if refused is not None:
        print_refusal(args, refused)
    return code


def _parse(argv: list[str]) -> argparse.Namespace:
    """parse_args, except that `cvs run` hands what it does not know to pytest, as CVS does.

    Everything after `run`'s first `--` is pytest's too, taken apart from argparse:
    argparse would otherwise give those words to FUNCTION.
    """
    parser = build_parser()

    if cvs_cli.cvs_importable():
        # `cvs --help` says which commands are CVS's.
        parser.epilog = "\n\n".join(p for p in (parser.epilog, cvs_cli.help_epilog()) if p)
    misplaced = _misplaced_option(parser, argv)
    if misplaced:
        parser.error(misplaced)
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "func", None) != "run:cmd_run":
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        return args
    if "--" in argv:
        cut = argv.index("--")
        args, unknown = parser.parse_known_args(argv[:cut])
        unknown += argv[cut + 1 :]
    args.pytest_args = unknown
    return args


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _takes_value(action: argparse.Action, word: str) -> bool:
    """Whether `word` (an option) takes the next word as its value."""
    return action.nargs != 0 and "=" not in word


def _misplaced_option(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """`cvs -c f --hosts node1 up`: an option of the command written before it
    (argparse would say `invalid choice: 'node1'`). The words that say so and
    the command line that works; None when the line has no such option."""
    commands = _subcommands(parser)
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        word = argv[i]
        known = parser._option_string_actions.get(word.split("=", 1)[0])
        if known is not None:
            i += 2 if _takes_value(known, word) else 1
            continue
        command = next((w for w in argv[i + 1 :] if w in commands), None)
        if command is None:
            return None
        action = commands[command]._option_string_actions.get(word.split("=", 1)[0])
        if action is None:
            return None
        moved = argv[i : i + 2] if _takes_value(action, word) else argv[i : i + 1]
        rest = argv[:i] + argv[i + len(moved) :]
        at = rest.index(command) + 1
        fixed = shlex.join(["cvs", *rest[:at], *moved, *rest[at:]])
        return (
            f"{word.split('=', 1)[0]} is an option of `cvs {command}`: write it after the "
            f"command ({fixed})"
        )
    return None


def _first_expected(group: BaseExceptionGroup) -> BaseException | None:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = _first_expected(exc)
            if found is not None:
                return found
        elif isinstance(exc, CvsError | OSError | KeyboardInterrupt):
            return exc
    return None


# A path the user named is missing or not usable: fix the input (exit 2). Anything
# else from the OS (disk full, I/O error) is a failure of the run (exit 1).
_USAGE_ERRNOS = frozenset(
    {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.EROFS}
)


def _report(exc: BaseException, args: argparse.Namespace | None = None) -> int:
    """One line on stderr (and the result line under --json); the exit code."""
    if isinstance(exc, KeyboardInterrupt):
        message, code = "interrupted", ExitCode.INTERRUPTED
    elif isinstance(exc, CvsError):
        from orchestrator.cli.common import cli_message

        message, code = cli_message(exc), exc.exit_code
    else:
        assert isinstance(exc, OSError)
        where = f": {exc.filename}" if exc.filename else ""
        message = f"{exc.strerror or exc}{where}"
        code = ExitCode.USAGE if exc.errno in _USAGE_ERRNOS else ExitCode.FAILED
    sys.stderr.write(f"cvs: {message}\n")
    if args is not None and getattr(args, "json", False):
        from orchestrator.cli.common import write_json_result

        write_json_result(args, ok=False, exit_code=code, error=message)
    return code


def _apply_color(choice: str | None) -> None:
    """--color never is NO_COLOR (https://no-color.org), which rich and our sinks honour;
    --color always is rich's FORCE_COLOR. auto leaves the environment as it is."""
    if choice == "never":
        os.environ["NO_COLOR"] = "1"
        os.environ.pop("FORCE_COLOR", None)
    elif choice == "always":
        os.environ.pop("NO_COLOR", None)
        os.environ["FORCE_COLOR"] = "1"


def _json_error(command: str | None, error: str) -> None:
    doc = {"command": command, "ok": False, "exit_code": 2, "error": error}
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
