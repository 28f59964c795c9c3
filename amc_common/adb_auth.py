"""adb's RSA keys, as a phone checks them: the public key an adb server's `adbkey.pub` holds
(and sends in AUTH RSAPUBLICKEY), and the signature of a phone's 20-byte AUTH token made
with its private key (RSA PKCS#1 v1.5 over the token taken as a SHA-1 digest, as adb's
RSA_sign(NID_sha1) makes it). Pure Python: one modular exponentiation per check.

The key's format is Android's `RSAPublicKey` (libcrypto_utils android_pubkey), base64 and
then ` user@host`: modulus size in words (64), n0inv (-1/n mod 2^32), the modulus and
R^2 mod n (little-endian, 256 bytes each), the exponent.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
from dataclasses import dataclass
from pathlib import Path

MODULUS_BYTES = 256
_KEY = struct.Struct(f"<II{MODULUS_BYTES}s{MODULUS_BYTES}sI")
# DER of DigestInfo{sha1} before the 20-byte digest (PKCS#1 v1.5, RFC 8017 9.2).
_SHA1_PREFIX = bytes.fromhex("3021300906052b0e03021a05000414")


class NotAKey(ValueError):
    """The text is not an adb public key."""


@dataclass(frozen=True)
class AdbKey:
    """An adb public key: its modulus and exponent, and what it was called (user@host)."""

    modulus: int
    exponent: int
    comment: str = ""

    def verifies(self, token: bytes, signature: bytes) -> bool:
        """Whether `signature` is this key's signature of `token`."""
        if len(signature) != MODULUS_BYTES:
            return False
        value = int.from_bytes(signature, "big")
        if value >= self.modulus:
            return False
        got = pow(value, self.exponent, self.modulus).to_bytes(MODULUS_BYTES, "big")
        return got == _padded(token)

    def encode(self) -> str:
        """The key as adb writes it into adbkey.pub (without the newline)."""
        n = self.modulus
        n0inv = (-pow(n, -1, 1 << 32)) % (1 << 32)
        rr = pow(2, MODULUS_BYTES * 8 * 2, n)
        raw = _KEY.pack(
            MODULUS_BYTES // 4,
            n0inv,
            n.to_bytes(MODULUS_BYTES, "little"),
            rr.to_bytes(MODULUS_BYTES, "little"),
            self.exponent,
        )
        text = base64.b64encode(raw).decode()
        return f"{text} {self.comment}" if self.comment else text


def _padded(token: bytes) -> bytes:
    digest = _SHA1_PREFIX + token
    fill = MODULUS_BYTES - len(digest) - 3
    return b"\x00\x01" + b"\xff" * fill + b"\x00" + digest


def parse_key(text: str | bytes) -> AdbKey:
    """An adb public key from adbkey.pub's text or an AUTH RSAPUBLICKEY payload."""
    if isinstance(text, bytes):
        text = text.rstrip(b"\0").decode(errors="replace")
    encoded, _, comment = text.strip().partition(" ")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise NotAKey("not base64") from None
    if len(raw) != _KEY.size:
        raise NotAKey(f"{len(raw)} bytes, where an adb key is {_KEY.size}")
    words, _, modulus, _, exponent = _KEY.unpack(raw)
    if words != MODULUS_BYTES // 4:
        raise NotAKey(f"a modulus of {words} words, where adb's is {MODULUS_BYTES // 4}")
    return AdbKey(int.from_bytes(modulus, "little"), exponent, comment.strip())


def user_key_path(env: dict[str, str] | None = None) -> Path:
    """Where this user's adb server keeps its public key: $ANDROID_USER_HOME/adbkey.pub,
    else ~/.android/adbkey.pub (adb makes the pair when its server first starts)."""
    env = dict(os.environ) if env is None else env
    if android := env.get("ANDROID_USER_HOME"):
        return Path(android) / "adbkey.pub"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".android" / "adbkey.pub"


def read_keys(paths: list[Path]) -> list[AdbKey]:
    """The keys of these adbkey.pub files that exist and hold one (others are skipped)."""
    keys = []
    for path in paths:
        try:
            keys.append(parse_key(path.read_text(errors="replace")))
        except (OSError, NotAKey):
            continue
    return keys
