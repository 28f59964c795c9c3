"""The adb transport's packets (AOSP adb `protocol.txt`): what an adb server and a phone's
adbd say to each other over USB or TCP, one 24-byte header and its payload each, encoded
and read here for an adb door (the device end the adb client connects to) and the tests'
fake phones.

    header: command, arg0, arg1, data_length, data_check, magic  (6 little-endian u32)
            magic == command ^ 0xffffffff; data_check is the payload's byte sum, which
            peers of version A_VERSION_SKIP_CHECKSUM and later leave at 0 and ignore

`read_message` refuses what is not a packet (a bad magic, a payload past the limit, a
checksum that does not add up where one is owed) with `ProtocolError`: adbd's own answer
to that is to drop the connection, and so is the door's.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453

A_VERSION_MIN = 0x01000000
# From this version on, senders may leave data_check at 0.
A_VERSION_SKIP_CHECKSUM = 0x01000001
A_VERSION = A_VERSION_SKIP_CHECKSUM
# The largest payload the fake and simulated phones say they take: adb servers send up to
# the smaller of theirs and this. A door takes what a phone's adbd takes today (1 MiB).
MAX_PAYLOAD = 256 * 1024
DOOR_PAYLOAD = 1024 * 1024
# What a packet before the CNXN may carry (adb's MAX_PAYLOAD_V1).
MAX_PAYLOAD_V1 = 4096

# AUTH packets' arg0.
AUTH_TOKEN = 1
AUTH_SIGNATURE = 2
AUTH_RSAPUBLICKEY = 3
TOKEN_SIZE = 20

HEADER = struct.Struct("<6I")
NAMES = {
    A_CNXN: "CNXN",
    A_AUTH: "AUTH",
    A_OPEN: "OPEN",
    A_OKAY: "OKAY",
    A_CLSE: "CLSE",
    A_WRTE: "WRTE",
    A_STLS: "STLS",
}


class ProtocolError(Exception):
    """The peer sent something that is not an adb packet (or not one it may send)."""


@dataclass(frozen=True)
class Message:
    """One packet: a command, its two arguments and its payload."""

    command: int
    arg0: int
    arg1: int
    data: bytes = b""

    def encode(self, checksum: bool = True) -> bytes:
        """The packet on the wire; `checksum`: fill data_check in (owed to peers older
        than A_VERSION_SKIP_CHECKSUM)."""
        check = sum(self.data) & 0xFFFFFFFF if checksum and self.data else 0
        magic = self.command ^ 0xFFFFFFFF
        header = HEADER.pack(self.command, self.arg0, self.arg1, len(self.data), check, magic)
        return header + self.data

    @property
    def name(self) -> str:
        return NAMES.get(self.command, f"{self.command:#010x}")

    def text(self) -> str:
        """The payload as text, without its trailing NULs (an OPEN's service, a banner)."""
        return self.data.rstrip(b"\0").decode(errors="replace")

    def __str__(self) -> str:
        return f"{self.name}({self.arg0:#x}, {self.arg1:#x}, {self.data[:60]!r})"


async def read_message(
    reader: asyncio.StreamReader, max_payload: int = MAX_PAYLOAD, checked: bool = False
) -> Message:
    """The next packet; `checked`: its data_check must be its payload's byte sum (a peer
    older than A_VERSION_SKIP_CHECKSUM). EOF raises asyncio.IncompleteReadError."""
    header = await reader.readexactly(HEADER.size)
    command, arg0, arg1, length, check, magic = HEADER.unpack(header)
    if magic != command ^ 0xFFFFFFFF:
        raise ProtocolError(f"bad magic {magic:#x} for command {command:#x}")
    if length > max_payload:
        raise ProtocolError(f"a payload of {length} bytes, past the {max_payload} agreed")
    data = await reader.readexactly(length) if length else b""
    if checked and (sum(data) & 0xFFFFFFFF) != check:
        raise ProtocolError(f"{NAMES.get(command, hex(command))}: its checksum does not match")
    return Message(command, arg0, arg1, data)


def device_banner(product: str, model: str, device: str, features: list[str]) -> bytes:
    """A phone's CNXN payload: `device::ro.product.name=…;…;features=a,b`."""
    fields = [
        f"ro.product.name={product}",
        f"ro.product.model={model}",
        f"ro.product.device={device}",
        f"features={','.join(features)}",
    ]
    return ("device::" + ";".join(fields) + ";").encode()


def banner_features(banner: str) -> list[str]:
    """The features a CNXN banner (`host::features=a,b` or a device's) says it has."""
    _, _, props = banner.partition("::")
    for prop in props.split(";"):
        key, _, value = prop.partition("=")
        if key == "features":
            return [f for f in value.split(",") if f]
    return []
