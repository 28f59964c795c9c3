"""`amc adb` from start to end: bind the port (a port in use is refused before anything is
queued), open the session (amc_client.opening: told as it waits, bounded by the queue
timeout), open the door once the phone is dispatched, say what to connect to, and serve it
until the session ends or the user stops it (Ctrl-C, SIGTERM: the session is closed, done).
The exit code says how the session ended: 0 closed by its user, 8 failed (the idle
timeout, a lost lease, the longest duration), 9 cancelled; 5 when the door's call broke
(the session is then abandoned: the door cannot outlive its carriage).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli.adb_door import AdbDoor
from amc_cli.adb_link import DoorLink
from amc_cli.errors import BadInput, CliError, ExitCode
from amc_client import Farm
from amc_client.actions import seconds
from amc_client.errors import AmcClientError, SessionRefused, session_ended
from amc_client.opening import open_phone
from amc_client.phone import ENDING_PATIENCE, TERMINAL, Phone
from amc_common.adb_auth import AdbKey, read_keys, user_key_path

HOST = "127.0.0.1"
Say = Callable[[str], None]


@dataclass(frozen=True)
class DoorOptions:
    address: str
    token: str | None
    ca_file: Path | None = None
    tls: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    serial: str = ""
    port: int = 0
    idle_timeout: float = 600.0
    max_duration: float | None = None
    queue_timeout: float | None = 60.0
    # The adbkey.pub files whose keys may connect (empty: the user's own).
    keys: tuple[Path, ...] = ()


async def run_door(options: DoorOptions, say: Say, show: Say) -> int:
    """Serve one door from its session's opening to its end; the exit code. `show` prints
    what a script reads (the `adb connect` line), `say` what a person is told."""
    paths = list(options.keys) or [user_key_path()]
    if not any(p.exists() for p in paths):
        say(
            f"no adb key at {', '.join(map(str, paths))} yet: adb makes one when its server"
            " first starts; the door reads it when adb connects"
        )
    async with Farm(options.address, options.token, ca_file=options.ca_file, tls=options.tls) as f:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            return await _serve(f, options, lambda: read_keys(paths), stop, say, show)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


async def _serve(
    farm: Farm,
    options: DoorOptions,
    keys: Callable[[], list[AdbKey]],
    stop: asyncio.Event,
    say: Say,
    show: Say,
) -> int:
    door = AdbDoor(keys, say)
    try:
        port = await door.listen(HOST, options.port)
    except OSError as exc:
        why = (exc.strerror or str(exc)).rpartition(": ")[2]
        raise BadInput(f"--port {options.port}: cannot listen on {HOST}: {why}") from None
    link: DoorLink | None = None
    phone: Phone | None = None
    try:
        phone = await _open(farm, options, say, stop)
        if phone is None:
            return ExitCode.INTERRUPTED
        link = DoorLink(farm.scheduler, phone.task_id)
        adb_phone = await link.open()
        await door.start(link, adb_phone)
        say(f"phone {phone.serial} ({adb_phone.model}) is yours: session {phone.task_id}")
        show(f"adb connect {HOST}:{port}")
        serving = asyncio.ensure_future(link.run())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        by_user = not serving.done()
        serving.cancel()
        await door.close()
        await link.close()
        return await _ended(farm, phone, link.why, by_user, say)
    except grpc.aio.AioRpcError as exc:
        if phone is not None:
            phone.abandon()
        raise CliError(f"the door did not open: {exc.code().name}: {exc.details()}") from None
    except SessionRefused as exc:
        raise CliError(str(exc), ExitCode.TASK_FAILED) from None
    finally:
        await door.close()
        if link is not None:
            await link.close()


async def _open(farm: Farm, options: DoorOptions, say: Say, stop: asyncio.Event) -> Phone | None:
    """The session's phone once dispatched; None if the user stopped the wait."""
    opening = scheduler_pb2.SessionOpen(
        selector=task_pb2.DeviceSelector(serial=options.serial, labels=options.labels),
        idle_timeout=seconds(options.idle_timeout),
        adb=True,
        metadata={"door": "adb"},
    )
    if options.max_duration is not None:
        opening.max_duration.CopyFrom(seconds(options.max_duration))
    if options.queue_timeout is not None:
        opening.queue_timeout.CopyFrom(seconds(options.queue_timeout))
    told: set[str] = set()

    def waiting(task: task_pb2.Task) -> None:
        if task.status == task_pb2.TASK_STATUS_QUEUED and task.pending_reason not in told:
            told.add(task.pending_reason)
            say(f"waiting for a phone: {task.pending_reason or 'queued'}")

    opened = asyncio.ensure_future(
        open_phone(
            farm.scheduler,
            farm.retry,
            opening,
            queue_timeout=options.queue_timeout,
            on_wait=waiting,
            finished=lambda task_id: farm.wait(task_id),
        )
    )
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({opened, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if opened.done():
        return opened.result()
    opened.cancel()  # the opening withdraws its session as it is cancelled
    with contextlib.suppress(asyncio.CancelledError, AmcClientError, grpc.aio.AioRpcError):
        await opened
    say("stopped before a phone came: the session is withdrawn")
    return None


async def _ended(farm: Farm, phone: Phone, why: str, by_user: bool, say: Say) -> int:
    """Close the session (or read how the farm ended it); the exit code."""
    broken = why.startswith("the door's call ended")
    if broken and not by_user and not await _finished(farm, phone.task_id):
        # The door's call broke and the farm has not ended the session: abandoned. (A
        # call that broke as the farm ended the session, a cancel say, is told as that.)
        phone.abandon()
        say(f"door closed: {why}; the session is abandoned")
        return ExitCode.UNAVAILABLE
    task = await phone.close()
    if task.status not in TERMINAL:
        # The session's call broke before its end came, and the farm did not say it in
        # time (a replica going away, say): unknown, not failed.
        say(f"door closed: the farm did not say how session {phone.task_id} ended")
        return ExitCode.UNAVAILABLE
    if task.status == task_pb2.TASK_STATUS_DONE:
        say(f"door closed: session {task.task_id} done")
        return ExitCode.OK
    # Ended otherwise, even where its user stopped it: the lease may have run out first.
    end = session_ended(task)
    say(f"door closed: the phone went offline: session {end.reason}")
    if task.status == task_pb2.TASK_STATUS_CANCELLED:
        return ExitCode.TASK_CANCELLED
    return ExitCode.TASK_FAILED


async def _finished(farm: Farm, task_id: str) -> bool:
    """Whether the session's task finished, or does within ENDING_PATIENCE s."""
    with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError, AmcClientError):
        await farm.wait(task_id, ENDING_PATIENCE)
        return True
    return False
