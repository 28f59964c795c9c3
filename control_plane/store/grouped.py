"""Group commit: calls that arrive while one group's statement is in flight wait, and go
together as the next group's one statement, each answered with its own outcome.

A call that finds nothing in flight starts a group at once (no added delay when idle);
those arriving while its statement runs queue, and go as the next group when it returns.
So one commit (one WAL flush) serves as many calls as arrived during the last one, and a
replica's concurrent writers wait on one statement instead of each on its own flush.

Each call gets its own answer: `write` answers each item with its result or its own
error (a request id being created concurrently, say). A group whose statement fails as a
whole (an item PostgreSQL refuses makes the whole statement fail) is written again one
item a statement, so the item at fault fails its own call only; an unavailable database
fails them all (each alone would fail the same way). A call is answered after its group's
statement returned, so after its commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from control_plane import errors

I = TypeVar("I")  # noqa: E741 - an item, as the callers hand it in
R = TypeVar("R")

# Most items in one group: a statement's arrays stay the size of a SubmitTasks batch.
MAX_GROUP = 500


@dataclass
class _Call(Generic[I, R]):
    item: I
    answer: asyncio.Future[R] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


Write = Callable[[Sequence[I]], Awaitable[Sequence[R | Exception]]]


class GroupCommit(Generic[I, R]):
    """`await group(item)`: `item` written with the others waiting (one statement,
    `write(items)`, answering each item in order), its own result returned or its own
    error raised."""

    def __init__(
        self,
        write: Write[I, R],
        max_group: int = MAX_GROUP,
        *,
        in_flight: int = 1,
        size: Callable[[I], int] = lambda _: 1,
        max_size: int = MAX_GROUP,
    ) -> None:
        """`in_flight`: statements in flight at once (a call finding fewer goes at once);
        a group holds at most `max_group` calls, and items of at most `max_size` in all
        by `size` (one item more than that when it alone is bigger)."""
        self._write = write
        self._max = max_group
        self._in_flight = in_flight
        self._size = size
        self._max_size = max_size
        self._waiting: list[_Call[I, R]] = []
        self._writers: set[asyncio.Task[None]] = set()
        # Groups written, and items in them (the tests', and the operator's, way to see
        # that calls are grouped).
        self.groups = 0
        self.items = 0

    async def __call__(self, item: I) -> R:
        call: _Call[I, R] = _Call(item)
        self._waiting.append(call)
        if len(self._writers) < self._in_flight:
            self._writers.add(asyncio.create_task(self._run()))
        # A caller that goes away leaves its item in the group: as with a statement of its
        # own in flight, it may be written all the same.
        return await asyncio.shield(call.answer)

    async def _run(self) -> None:
        try:
            while self._waiting:
                await self._group(self._next_group())
        except asyncio.CancelledError:
            for call in self._waiting:  # the replica stopping with calls waiting
                _answer(call, errors.Unavailable("control plane shutting down; retry"))
            self._waiting.clear()
            raise
        finally:
            # Not counted from the moment nothing waits (no await in between): a call
            # arriving next starts a writer. (A done callback would come a loop turn late,
            # and a call arriving in between would wait for the next one.)
            writer = asyncio.current_task()
            assert writer is not None
            self._writers.discard(writer)

    def _next_group(self) -> list[_Call[I, R]]:
        n, size = 0, 0
        while n < min(self._max, len(self._waiting)):
            size += self._size(self._waiting[n].item)
            if n and size > self._max_size:
                break
            n += 1
        group = self._waiting[:n]
        del self._waiting[:n]
        return group

    async def _group(self, group: list[_Call[I, R]]) -> None:
        self.groups += 1
        self.items += len(group)
        try:
            answers = await self._write([c.item for c in group])
        except errors.DatabaseUnavailable as exc:
            for call in group:
                _answer(call, exc)
            return
        except Exception as exc:
            if len(group) == 1:
                _answer(group[0], exc)
                return
            # One item may have failed them all: each again in a statement of its own.
            await asyncio.gather(*(self._group([call]) for call in group))
            return
        except BaseException as exc:
            for call in group:
                _answer(call, errors.Unavailable("control plane shutting down; retry"))
            raise exc
        for call, answer in zip(group, answers, strict=True):
            _answer(call, answer)


def _answer(call: _Call[I, R], answer: R | BaseException) -> None:
    if call.answer.done():
        return
    if isinstance(answer, BaseException):
        call.answer.set_exception(answer)
        with contextlib.suppress(BaseException):
            call.answer.exception()  # retrieved: no "never retrieved" warning if unawaited
    else:
        call.answer.set_result(answer)
