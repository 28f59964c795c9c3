"""Logging set-up shared by the control plane, the host agent and the scripts.

structlog everywhere: a console renderer on a terminal, JSON lines otherwise (or as chosen
with `--log-format`). Our lines are written by structlog directly; standard-library
loggers (grpc, asyncio) go through logging and are rendered by the same processors.

Every rendered line passes through `amc_common.secrets.redact`, so a token or a database
password that reaches a log line (in a value, a message or a traceback) is masked there.
Tracebacks are plain text and never show local variables (Rich's `show_locals` printed
the host token). `failure()` turns an exception into the one line of a failed start.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Literal

import structlog

from amc_common.secrets import redact

LogFormat = Literal["auto", "console", "json"]


def configure(fmt: LogFormat = "auto", level: str = "INFO") -> None:
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.types.Processor
    if fmt == "console":
        # Plain tracebacks: the default (Rich, show_locals=True) prints every frame's local
        # variables, secrets included, in a few hundred lines.
        renderer = structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
    else:
        renderer = structlog.processors.JSONRenderer()
    renderer = _redacting(renderer)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tracebacks = structlog.processors.format_exc_info if fmt == "json" else _identity
    numeric = logging.getLevelName(level.upper())
    # Our own lines go straight to stderr: a line below the level costs one method call,
    # and none goes through the logging module (a third of the agent's logging cost).
    structlog.configure(
        processors=[*shared, structlog.processors.StackInfoRenderer(), tracebacks, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Other libraries' loggers (grpc, asyncio) through logging, rendered the same way.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                tracebacks,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)


def _redacting(renderer: structlog.types.Processor) -> structlog.types.Processor:
    """The renderer, with every secret masked in the line it renders."""

    def render(logger: Any, name: str, event: structlog.types.EventDict) -> Any:
        line = renderer(logger, name, event)
        return redact(line) if isinstance(line, str) else line

    return render


def debug_enabled(flag: bool = False) -> bool:
    """--debug given, or AMC_DEBUG set (to anything but 0, false or nothing)."""
    return flag or os.environ.get("AMC_DEBUG", "").lower() not in ("", "0", "false", "no")


def describe(exc: BaseException) -> str:
    """One line for an exception, secrets masked: its type and message, then what caused
    it (`DatabaseUnavailable: … (ConnectionRefusedError: …)`). An exception group is
    described by its first exception; a gRPC error by its status code and details."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = _one(exc)
    root = _root_cause(exc)
    if root is not exc:
        text = f"{text} ({_one(root)})"
    return redact(" ".join(text.split()))


def _one(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if callable(code) and callable(details):  # grpc.RpcError that is a grpc.Call
        try:
            return f"{code().name}: {details() or ''}".rstrip(": ")
        except Exception:  # not a finished call after all
            pass
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _root_cause(exc: BaseException) -> BaseException:
    seen = {id(exc)}
    while True:
        cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if cause is None or id(cause) in seen:
            return exc
        seen.add(id(cause))
        exc = cause


def root_cause(exc: BaseException) -> BaseException:
    """The first exception of the chain that led to `exc` (`exc` itself if none did)."""
    return _root_cause(exc)


def failure(
    logger: Any,
    event: str,
    exc: BaseException,
    *,
    debug: bool,
    hint: str = "",
    error: str | None = None,
    **fields: Any,
) -> None:
    """Log that the process cannot go on, in one line: `event`, the error (`describe`, or
    `error`) and what to do about it. The traceback only with `debug`, and never any local
    variable."""
    if not debug:
        hint = f"{hint}; --debug shows the traceback" if hint else "--debug shows the traceback"
    extra: dict[str, Any] = {"exc_info": exc} if debug else {}
    logger.error(event, error=redact(error or describe(exc)), hint=hint, **fields, **extra)


def _identity(
    _logger: object, _name: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    return event
