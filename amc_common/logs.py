"""Logging set-up shared by the control plane, the host agent and the scripts.

structlog everywhere: a console renderer on a terminal, JSON lines otherwise (or as chosen
with `--log-format`). Our lines are written by structlog directly; standard-library
loggers (grpc, asyncio) go through logging and are rendered by the same processors.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "console", "json"]


def configure(fmt: LogFormat = "auto", level: str = "INFO") -> None:
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.types.Processor
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
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


def _identity(
    _logger: object, _name: str, event: structlog.types.EventDict
) -> structlog.types.EventDict:
    return event
