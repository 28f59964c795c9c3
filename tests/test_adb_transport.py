"""The adb door's pieces on their own: the transport's packets, adb's keys and signatures,
which services a door opens for whom, and the per-stream windows of the carriage."""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import pytest

from amc.v1 import adb_pb2
from amc_common import adb_transport as t
from amc_common.adb_auth import NotAKey, parse_key, read_keys, user_key_path
from amc_common.adb_carriage import CHUNK, JOINED, WINDOW, Carriage
from amc_common.adb_services import never, refusal
from amc_testing.adb_client import AdbClientKey
from host_agent.adb_door import carry
from host_agent.stop_token import StopReason, StopToken
from tests.support.fakes.real_adb import RealAdbServer


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_a_packet_reads_back_as_it_was_written() -> None:
    """THEN command, arguments and payload survive, with or without the checksum."""
    message = t.Message(t.A_WRTE, 3, 7, b"hello")
    for checked in (True, False):
        got = await t.read_message(_reader(message.encode(checksum=checked)), checked=checked)
        assert got == message


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (struct.pack("<6I", t.A_OPEN, 1, 0, 0, 0, 0), "bad magic"),
        (t.HEADER.pack(t.A_WRTE, 1, 1, 10**7, 0, t.A_WRTE ^ 0xFFFFFFFF), "past the"),
        (t.HEADER.pack(t.A_WRTE, 1, 1, 2, 999, t.A_WRTE ^ 0xFFFFFFFF) + b"hi", "checksum"),
    ],
)
async def test_a_malformed_packet_is_a_protocol_error_naming_what_is_wrong(
    raw: bytes, why: str
) -> None:
    """THEN read_message refuses it, saying why (the door then drops the connection)."""
    with pytest.raises(t.ProtocolError, match=why):
        await t.read_message(_reader(raw), checked=True)


def test_a_device_banner_says_the_phone_and_its_features() -> None:
    banner = t.device_banner("p", "Pixel 9", "d", ["shell_v2", "cmd"]).decode()
    assert banner.startswith("device::ro.product.name=p;ro.product.model=Pixel 9;")
    assert t.banner_features(banner) == ["shell_v2", "cmd"]


def test_an_adb_signature_verifies_with_its_key_only() -> None:
    """THEN a key's signature of the token verifies (its adbkey.pub read back), another
    token's or another key's does not."""
    key, other = AdbClientKey(), AdbClientKey()
    public = parse_key(key.public.encode())
    token = b"t" * t.TOKEN_SIZE
    assert public.verifies(token, key.sign(token))
    assert not public.verifies(b"u" * t.TOKEN_SIZE, key.sign(token))
    assert not public.verifies(token, other.sign(token))
    assert not public.verifies(token, b"\0" * 3)


async def test_the_key_a_real_adb_server_made_is_read(tmp_path: Path) -> None:
    """THEN adbkey.pub as adb writes it is a key (user@host after it)."""
    async with RealAdbServer(tmp_path / "adb") as server:
        path = server.home / ".android" / "adbkey.pub"
        (key,) = read_keys([path, tmp_path / "absent.pub"])
    assert key.modulus.bit_length() == 2048 and key.exponent == 65537
    assert parse_key(key.encode()) == key


def test_what_is_not_a_key_is_refused() -> None:
    for text in ("", "not base64!", "aGVsbG8="):
        with pytest.raises(NotAKey):
            parse_key(text)


def test_the_users_key_is_where_adb_keeps_it(tmp_path: Path) -> None:
    assert user_key_path({"HOME": "/h"}) == Path("/h/.android/adbkey.pub")
    assert user_key_path({"ANDROID_USER_HOME": "/a", "HOME": "/h"}) == Path("/a/adbkey.pub")


@pytest.mark.parametrize(
    "service",
    ["root:", "unroot:", "remount:", "reboot:", "reboot:bootloader", "tcpip:5555", "usb:"],
)
def test_a_client_is_refused_what_is_for_operators_and_an_operator_is_not(service: str) -> None:
    assert "is for operators" in (refusal(service, operator=False) or "")
    assert refusal(service, operator=True) is None


@pytest.mark.parametrize(
    "service",
    [
        "host:transport:other",
        "host-serial:x:shell:ls",
        "host:kill",
        "reverse:forward:tcp:1;tcp:2",
        "",
    ],
)
def test_nobody_opens_what_reaches_past_the_phone(service: str) -> None:
    assert never(service) is not None
    assert refusal(service, operator=True) is not None


@pytest.mark.parametrize(
    "service",
    ["shell:ls", "shell:", "exec:cmd package install -S 1", "sync:", "tcp:8080", "jdwp:1"],
)
def test_what_a_client_asks_of_its_phone_is_carried(service: str) -> None:
    assert refusal(service, operator=False) is None


async def test_a_stream_sends_no_more_than_its_window_before_an_ack() -> None:
    """THEN the sender waits once WINDOW bytes are unacknowledged, and goes on with the
    ack; another stream is not held up meanwhile."""
    sent: list[adb_pb2.AdbFrame] = []
    carriage = Carriage(lambda message: sent.append(message.frame), adb_pb2.AdbStreamsRequest)
    slow, other = carriage.stream(1), carriage.stream(2)
    sending = asyncio.ensure_future(slow.send(b"x" * (WINDOW + 1)))
    await asyncio.sleep(0.05)
    assert not sending.done()
    assert sum(len(f.data) for f in sent if f.stream == 1) == WINDOW
    assert await other.send(b"y")
    carriage.deliver(adb_pb2.AdbFrame(stream=1, ack=WINDOW))
    assert await asyncio.wait_for(sending, 5)
    assert sum(len(f.data) for f in sent if f.stream == 1) == WINDOW + 1


async def test_frames_waiting_for_their_reader_are_read_as_one_up_to_joined() -> None:
    """THEN what a stream's reader finds waiting is read at once, as one write's worth (one
    packet to the adb server or client, not one per frame), never more than JOINED, and in
    order; what it read is acknowledged whole."""
    sent: list[adb_pb2.AdbFrame] = []
    carriage = Carriage(lambda message: sent.append(message.frame), adb_pb2.AdbStreamsRequest)
    carried = carriage.stream(1)
    frames = [bytes([i]) * CHUNK for i in range(JOINED // CHUNK + 2)]
    for data in frames:
        carriage.deliver(adb_pb2.AdbFrame(stream=1, data=data))
    first = await carried.recv()
    assert first == b"".join(frames[: JOINED // CHUNK])
    assert await carried.recv() == b"".join(frames[JOINED // CHUNK :])
    assert first is not None
    carried.ack(len(first))
    assert [f.ack for f in sent] == [len(first)]


async def test_a_streams_end_reaches_its_reader_after_what_came_before() -> None:
    carriage = Carriage(lambda message: None, adb_pb2.AdbStreamsRequest)
    carried = carriage.stream(1)
    carriage.deliver(adb_pb2.AdbFrame(stream=1, data=b"last words"))
    carriage.deliver(adb_pb2.AdbFrame(stream=1, close="done"))
    assert await carried.recv() == b"last words"
    assert await carried.recv() is None
    assert carried.ended_by_peer == "done"


class _Phone:
    """A stream's connection to a phone that has something to say, and keeps what it is
    written."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self._said = False

    async def read(self) -> bytes:
        if not self._said:
            self._said = True
            return b"from the phone"
        await asyncio.Event().wait()
        return b""

    async def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        pass


async def test_no_byte_crosses_a_hosts_door_once_its_lease_is_over() -> None:
    """GIVEN a stream with bytes waiting each way and a lease whose fencing deadline passed
    (a process that woke from a freeze: its timer has not fired yet) THEN the host's door
    writes nothing to the phone and sends nothing of it, and the stream ends."""
    sent: list[adb_pb2.AdbFrame] = []
    carriage = Carriage(lambda message: sent.append(message.frame), adb_pb2.LeaseAdbStreamsRequest)
    carried = carriage.stream(1)
    carriage.deliver(adb_pb2.AdbFrame(stream=1, data=b"to the phone"))
    token = StopToken()
    token.trip_at(time.monotonic() - 1.0, StopReason.LEASE_LOST)
    phone = _Phone()
    carrying = asyncio.ensure_future(carry(phone, carried, token))
    done, _ = await asyncio.wait({carrying}, timeout=5)
    carrying.cancel()
    assert phone.written == []
    assert [f for f in sent if f.WhichOneof("part") == "data"] == []
    assert done == {carrying}
