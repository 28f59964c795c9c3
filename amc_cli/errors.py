"""What can go wrong in `amc`, and the exit code each failure leaves for scripts.

    CliError                 exit 1, or the code it carries
    ├── BadInput             exit 2: a bad flag value, an unreadable or malformed file
    │   └── SpecError        exit 2: a task-spec file, with its name and line
    └── RpcFailed            the control plane said no; the code follows its status

A failed call keeps the server's own words and names its status code, so the one line
printed is enough to act on.
"""

from __future__ import annotations

import enum

import grpc


class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    BAD_INPUT = 2
    NOT_FOUND = 3
    CONFLICT = 4
    UNAVAILABLE = 5
    AUTH = 6
    TASK_FAILED = 8
    TASK_CANCELLED = 9
    INTERRUPTED = 130


EXIT_CODES_HELP = """\
**Exit codes:**
0 ok ·
1 any other error ·
2 bad input (usage, spec file, INVALID_ARGUMENT) ·
3 not found ·
4 conflict (FAILED_PRECONDITION, ABORTED, ALREADY_EXISTS) ·
5 unavailable (UNAVAILABLE, DEADLINE_EXCEEDED) ·
6 auth (UNAUTHENTICATED, PERMISSION_DENIED).
watch, submit --wait and cancel --wait end with 0 when the task is done,
8 when it failed, 9 when it was cancelled."""

_BY_STATUS: dict[grpc.StatusCode, ExitCode] = {
    grpc.StatusCode.INVALID_ARGUMENT: ExitCode.BAD_INPUT,
    grpc.StatusCode.OUT_OF_RANGE: ExitCode.BAD_INPUT,
    grpc.StatusCode.NOT_FOUND: ExitCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION: ExitCode.CONFLICT,
    grpc.StatusCode.ABORTED: ExitCode.CONFLICT,
    grpc.StatusCode.ALREADY_EXISTS: ExitCode.CONFLICT,
    grpc.StatusCode.UNAVAILABLE: ExitCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: ExitCode.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: ExitCode.AUTH,
    grpc.StatusCode.PERMISSION_DENIED: ExitCode.AUTH,
}


class CliError(Exception):
    """The command failed; `message` is the one line shown after `amc: error:`."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0])


class BadInput(CliError):
    exit_code = ExitCode.BAD_INPUT


class SpecError(BadInput):
    """A problem in a task-spec file: `where` is `file:line` (or just `file`)."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {problem}")


class RpcFailed(CliError):
    def __init__(self, message: str, status: grpc.StatusCode) -> None:
        super().__init__(message, _BY_STATUS.get(status, ExitCode.ERROR))
        self.status = status


def rpc_failed(
    exc: grpc.RpcError,
    doing: str,
    address: str,
    has_token: bool,
    unavailable: str | None = None,
) -> RpcFailed:
    """One line for a failed call: what we were doing, the server's words, the code.
    `unavailable`: what an UNAVAILABLE means here, when it was found out (amc_cli.diagnose)."""
    status = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = " ".join((exc.details() if isinstance(exc, grpc.Call) else "").split())
    name = status.name if status else "UNKNOWN"
    if status is grpc.StatusCode.UNAVAILABLE:
        text = unavailable or f"cannot reach the control plane at {address}: {details}"
    elif status is grpc.StatusCode.DEADLINE_EXCEEDED:
        text = f"{doing}: no answer from {address} in time (try --timeout)"
    elif status is grpc.StatusCode.UNAUTHENTICATED and not has_token:
        text = f"{doing}: {details} (no token given: set AMC_TOKEN, --token or --token-file)"
    else:
        text = f"{doing}: {details}"
    return RpcFailed(f"{text} ({name})", status)
