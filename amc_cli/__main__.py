"""`amc` entry point: run the command, turn any failure into one line and an exit code.

Nothing escapes as a traceback: usage mistakes, bad files and refused calls each print
`amc: error: ...` on stderr and exit with the code from `amc_cli.errors.ExitCode`.
AMC_DEBUG=1 shows the traceback of an unexpected error.
"""

from __future__ import annotations

import os

# No gRPC C-core lines (a failed TLS handshake, say) on stderr: every failure gets one line
# of ours instead. Set before grpc is imported; the user's own settings win.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
os.environ.setdefault("GRPC_TRACE", "")

import re
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import typer

from amc_cli.app import app
from amc_cli.errors import CliError, ExitCode
from amc_common.secrets import redact

PROG = "amc"
# The parser's messages come from pydantic, which prefixes a ValueError's words.
_VALIDATOR_PREFIX = re.compile(r"\b(Value error|Assertion failed), ")


def _error(message: str) -> None:
    sys.stderr.write(f"{PROG}: error: {redact(' '.join(message.split()))}\n")
    sys.stderr.flush()


def run(argv: Sequence[str] | None = None) -> int:
    """Runs `amc` with these arguments; returns the exit code."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name=PROG, standalone_mode=False)
    except CliError as exc:
        _error(exc.message)
        return exc.exit_code
    except typer.TyperException as exc:  # usage errors, from the command-line parser
        return _usage_error(exc)
    except typer.Abort:
        _error("aborted")
        return ExitCode.ERROR
    except BrokenPipeError:
        # The reader went away (`amc list | head`): say nothing, and point stdout at
        # /dev/null so the interpreter's final flush does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.ERROR
    except Exception as exc:
        if os.environ.get("AMC_DEBUG"):
            sys.stderr.write(redact(traceback.format_exc()))  # never locals, never a token
        _error(f"unexpected {type(exc).__name__}: {exc} (AMC_DEBUG=1 shows where)")
        return ExitCode.ERROR
    return result if isinstance(result, int) else ExitCode.OK


def _usage_error(exc: typer.TyperException) -> int:
    code = int(getattr(exc, "exit_code", ExitCode.BAD_INPUT))
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":
        # `amc` or `amc tokens` alone: the help text is the answer.
        sys.stdout.write(exc.format_message() + "\n")
        return ExitCode.OK
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    _error(_VALIDATOR_PREFIX.sub("", exc.format_message()) + hint)
    return code


def main(argv: Sequence[str] | None = None) -> NoReturn:
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
