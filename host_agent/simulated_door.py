"""A simulated phone's adb services, for an adb door (host_agent.adb_door) and the
harnesses' simulated adbd (amc_testing.adbd): what `adb shell`, `push`, `pull`, `install`,
`logcat` and `forward` reach on a phone of `make run`, answered as the tests' fake phone
answers them.

* `shell:CMD`, `exec:CMD`, `exec-out:CMD`: the phone's shell answers each simple command
  of the line (`;`, `&&`, `||`; `echo` with `$?`; the others SimulatedDevice.shell, an
  action of the phone, timed and logged); `sleep N` sleeps; `logcat` prints the phone's
  log, the one its runs keep (host_agent.simulated_logcat), and follows it; an install
  from stdin (`cmd package install -S N`, what `adb install` sends) reads the APK and
  installs it (host_agent.simulated_apps). `shell:` alone is an interactive shell: a
  prompt, the line typed echoed, each line run when it ends (`exit` or ^D leaves).
* `sync:`: push, pull, stat and list on the phone's files (host_agent.simulated_sync).
* `tcp:7`: the phone's echo port (RFC 862), so that `adb forward` has something to reach.

Anything else is refused, as adbd refuses a service it lacks. Each stream is one action
of the phone (`adb`, its service) in the source's action log, from its open to its end,
so what a door did on a phone is there for a harness to hold against the phone's leases
(with when the door last wrote to it: `written_until`).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections import deque
from collections.abc import Awaitable, Callable

from amc.v1 import adb_pb2
from host_agent.adb_door import DoorConnection, DoorRefused
from host_agent.devices import DeviceError
from host_agent.simulated import ActionRecord, SimulatedSource
from host_agent.simulated_body import SIMULATED_PROPS
from host_agent.simulated_logcat import logcat_args, logcat_command
from host_agent.simulated_sync import serve_sync, stdin_size

ECHO_PORT = "tcp:7"
_OPERATORS = frozenset({";", "&&", "||"})
_SLEEP = re.compile(r"^\s*sleep\s+(\d+(?:\.\d+)?)\s*$")
_OUT_CHUNKS = 8
_SHELL_TIMEOUT = 60.0


class Pipe:
    """A service's connection: what the door writes is its stdin; what it prints waits,
    a few chunks at most, for the door to read it."""

    def __init__(self) -> None:
        self.stdin = asyncio.StreamReader()
        self._out: deque[bytes] = deque()
        self._changed = asyncio.Event()
        self._ended = False
        self.task: asyncio.Task[None] | None = None
        # When the door last wrote to the service (time.time()), for the action log.
        self.written_at = 0.0

    async def read(self) -> bytes:
        while not self._out:
            if self._ended:
                return b""
            self._changed.clear()
            await self._changed.wait()
        data = self._out.popleft()
        self._changed.set()
        return data

    async def write(self, data: bytes) -> None:
        self.written_at = time.time()
        self.stdin.feed_data(data)

    def close(self) -> None:
        self.stdin.feed_eof()
        if self.task is not None:
            self.task.cancel()

    async def emit(self, data: bytes) -> None:
        """What the service prints (waits while the door has not read what came before)."""
        while len(self._out) >= _OUT_CHUNKS and not self._ended:
            self._changed.clear()
            await self._changed.wait()
        if data:
            self._out.append(data)
            self._changed.set()

    def end(self) -> None:
        self._ended = True
        self._changed.set()


Service = Callable[[Pipe], Awaitable[None]]


class SimulatedDoor:
    """One simulated phone's adb services."""

    def __init__(self, source: SimulatedSource, serial: str) -> None:
        self._source, self.serial = source, serial
        self._device = source.device(serial)

    async def phone(self) -> adb_pb2.AdbPhone:
        model = SIMULATED_PROPS["ro.product.model"]
        return adb_pb2.AdbPhone(
            product="simulated", model=model, device=self.serial, features=["cmd"]
        )

    async def open(self, service: str) -> DoorConnection:
        if not self._source.is_plugged(self.serial):
            raise DoorRefused(f"device '{self.serial}' not found")
        served = self._service(service)
        if served is None:
            raise DoorRefused("closed")
        pipe = Pipe()
        pipe.task = asyncio.create_task(self._run(service, served, pipe))
        return pipe

    def _service(self, service: str) -> Service | None:
        kind, _, command = service.partition(":")
        if service == ECHO_PORT:
            return _echo
        if kind == "sync" and not command:
            return self._sync
        if kind not in ("shell", "exec", "exec-out"):
            return None
        if kind == "shell" and not command.strip():
            return self._interactive
        return lambda pipe: self._command(command, pipe)

    async def _run(self, service: str, served: Service, pipe: Pipe) -> None:
        started, wall = time.monotonic(), time.time()
        outcome = "cancelled"
        try:
            await served(pipe)
            outcome = "ok"
        except DeviceError as exc:
            outcome = "lost"
            await pipe.emit(f"error: {exc}\n".encode())
        except EOFError:
            pass  # the door closed the stream before its stdin came
        finally:
            pipe.end()
            self._source.record(
                ActionRecord(
                    serial=self.serial,
                    action="adb",
                    args={"service": service[:200], "written_until": pipe.written_at or None},
                    started_monotonic=started,
                    ended_monotonic=time.monotonic(),
                    started_wall=wall,
                    ended_wall=time.time(),
                    outcome=outcome,
                )
            )

    async def _command(self, command: str, pipe: Pipe) -> None:
        if (argv := logcat_command(command)) is not None:
            head, _, _ = command.rpartition(";")  # what runs before it (`logcat -c; …`)
            if head.strip() and (printed := await self._sh(head)):
                await pipe.emit(printed)
            await self._logcat(argv, pipe)
        elif (size := stdin_size(command)) is not None:
            data = await pipe.stdin.readexactly(size)
            answer = self._source.apps[self.serial].stdin_command(command, data)
            await pipe.emit((answer or f"{command}: inaccessible\n").encode())
        elif sleep := _SLEEP.match(command):
            await asyncio.sleep(float(sleep[1]))
        else:
            await pipe.emit(await self._sh(command))

    async def _sh(self, command: str) -> bytes:
        """A command line as the phone's `sh` runs it: simple commands joined by `;`, `&&`
        and `||`, each answered by the phone (`echo` here, `$?` its last exit code)."""
        try:
            commands = split_commands(command)
        except ValueError:
            commands = [(";", command.split())]
        out, status = b"", 0
        for operator, argv in commands:
            if (operator == "&&" and status) or (operator == "||" and not status):
                continue
            if argv[:1] == ["echo"]:
                words = [w.replace("$?", str(status)) for w in argv[1:]]
                out, status = out + (" ".join(words) + "\n").encode(), 0
                continue
            if argv[:1] == ["export"]:  # a builtin: nothing to print (`adb logcat` sends one)
                status = 0
                continue
            result = await self._device.shell(shlex.join(argv), _SHELL_TIMEOUT)
            out, status = out + result.output.encode(), result.exit_code
        return out

    async def _logcat(self, argv: list[str], pipe: Pipe) -> None:
        """The phone's log, the one its runs keep (SimulatedSource.logs): printed, or
        followed until the phone is unplugged or the door closes the stream."""
        log, asked = self._source.logs[self.serial], logcat_args(argv)
        if asked.clear:
            log.clear()
        elif not asked.follows:
            await pipe.emit(log.dump(asked.tail, asked.usec).encode())
        elif self._source.is_plugged(self.serial):
            async for chunk in log.follow(self._source.unplugged(self.serial), asked.usec):
                await pipe.emit(chunk)

    async def _interactive(self, pipe: Pipe) -> None:
        prompt = f"{self.serial}:/ $ ".encode()
        await pipe.emit(prompt)
        typed = bytearray()
        while chunk := await pipe.stdin.read(4096):
            for byte in chunk:
                if byte == 0x04 or (byte in b"\r\n" and bytes(typed).strip() == b"exit"):
                    await pipe.emit(b"\r\n")
                    return
                if byte in b"\r\n":
                    await pipe.emit(b"\r\n")
                    if line := typed.decode(errors="replace").strip():
                        printed = await self._sh(line)
                        await pipe.emit(printed.replace(b"\n", b"\r\n"))
                    typed.clear()
                    await pipe.emit(prompt)
                elif byte == 0x7F:
                    if typed:
                        typed.pop()
                        await pipe.emit(b"\b \b")
                else:
                    typed.append(byte)
                    await pipe.emit(bytes([byte]))

    async def _sync(self, pipe: Pipe) -> None:
        async def read(n: int) -> bytes:
            return await pipe.stdin.readexactly(n)

        await serve_sync(self._source.apps[self.serial].files, read, pipe.emit)


async def _echo(pipe: Pipe) -> None:
    while chunk := await pipe.stdin.read(65536):
        await pipe.emit(chunk)


def split_commands(command: str) -> list[tuple[str, list[str]]]:
    """[(operator before it, argv)] for each simple command of a line; the first gets ';'.
    Tokenised with `shlex`, so quoting and backslash escapes behave as in `sh`."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    result: list[tuple[str, list[str]]] = []
    operator, argv = ";", list[str]()
    for token in lexer:
        if token in _OPERATORS:
            if argv:
                result.append((operator, argv))
            operator, argv = token, []
        else:
            argv.append(token)
    if argv:
        result.append((operator, argv))
    return result
