"""A Python client of an AMC farm: ordinary tasks and interactive sessions.

    from amc_client import Farm

    async with Farm("amc.example:50051", token=token) as farm:
        async with farm.session(labels={"model": "Pixel 8"}) as phone:
            await phone.tap(100, 200)
            png = await phone.screenshot()
            xml = await phone.ui_dump()
        task = await farm.submit([tap(10, 20)], labels={"model": "Pixel 8"})
        done = await farm.wait(task.task_id)

Modules:

- `farm`: `Farm`, the connection: submit / get / wait / watch / cancel, session()
- `opening`: opening a session, told why it waits, bounded by its queue timeout
- `phone`: `Phone`, one interactive session's actions (Scheduler.OpenSession)
- `actions`: builders of the amc.v1.Action messages, checked with the action table
- `errors`: the exceptions it raises
- `retry`: which errors are tried again, and how
- `mcp_server`: an MCP server lending phones to AI agents (needs the `mcp` extra), on stdio
  (`mcp_stdio`) or streamable HTTP (`mcp_http`, `mcp_clients`), with its tools
  (`mcp_session_tools`, `mcp_tools`), each client's sessions (`mcp_sessions`) and what
  they say (`mcp_phones`, `mcp_text`)

Its API pages, made from these docstrings by pdoc: docs/api/amc_client.html
(`make api-docs` writes them again).
"""

from amc_client.errors import (
    ActionFailed,
    ActionRefused,
    AmcClientError,
    FarmUnreachable,
    NoPhone,
    SessionCancelled,
    SessionDeadline,
    SessionEnded,
    SessionIdle,
    SessionLeaseLost,
    SessionRefused,
)
from amc_client.farm import Farm
from amc_client.phone import Phone

__all__ = [
    "ActionFailed",
    "ActionRefused",
    "AmcClientError",
    "Farm",
    "FarmUnreachable",
    "NoPhone",
    "Phone",
    "SessionCancelled",
    "SessionDeadline",
    "SessionEnded",
    "SessionIdle",
    "SessionLeaseLost",
    "SessionRefused",
]
