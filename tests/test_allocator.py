"""The replica's malloc settings (control_plane/allocator.py): on glibc, a fixed mmap
threshold of 128 KiB (a block that size is a mapping of its own, given back when freed),
two arenas and a 1 MiB trim threshold; an operator's own setting of one is kept. Each test
runs in a process of its own: the settings are the process's."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from amc.v1 import adb_pb2
from amc_common.adb_carriage import CHUNK

pytestmark = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the settings are glibc's"
)

# Prints what tune() set, and whether a 512 KiB block asked for after a 1 MiB one was freed
# became a mapping of its own (mallinfo2's hblks: the mmapped blocks in use). By default
# glibc raises its mmap threshold to the size of a freed mapped block (128 KiB at first),
# so the second block comes from the heap; with the threshold fixed, it is mapped.
PROBE = """
import ctypes, json, sys
from control_plane import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
applied = allocator.tune() if sys.argv[1] == "tune" else {}
libc.free(ctypes.c_void_p(libc.malloc(1024 * 1024)))
before = libc.mallinfo2().hblks
block = libc.malloc(512 * 1024)
mapped = libc.mallinfo2().hblks - before
libc.free(ctypes.c_void_p(block))
print(json.dumps({"applied": applied, "mapped": mapped}))
"""


def _probe(mode: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])  # after the log
    return result


def test_a_replica_sets_a_fixed_mmap_threshold_two_arenas_and_a_trim_threshold() -> None:
    assert _probe("tune") == {
        "applied": {"arena_max": 2, "mmap_threshold": 131072, "trim_threshold": 1048576},
        "mapped": 1,
    }


def test_without_the_settings_a_large_block_comes_from_the_heap_once_one_was_freed() -> None:
    """The probe can fail: with glibc's own default the threshold moves."""
    assert _probe("none") == {"applied": {}, "mapped": 0}


def test_an_operators_own_setting_in_the_environment_is_kept() -> None:
    kept = _probe("tune", MALLOC_ARENA_MAX="4", MALLOC_MMAP_THRESHOLD_="1048576")
    assert kept == {"applied": {"trim_threshold": 1048576}, "mapped": 0}
    tunables = _probe("tune", GLIBC_TUNABLES="glibc.malloc.trim_threshold=65536")
    assert tunables["applied"] == {"arena_max": 2, "mmap_threshold": 131072}


# Prints, for each block size asked for again and again after tune(), how many of the
# blocks were mappings of their own (mallinfo2's hblks while it was held).
SIZES = """
import ctypes, json, sys
from control_plane import allocator

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
allocator.tune()
mapped = {}
for size in json.loads(sys.argv[1]):
    mapped[str(size)] = 0
    for _ in range(20):
        before = libc.mallinfo2().hblks
        block = libc.malloc(size)
        mapped[str(size)] += libc.mallinfo2().hblks - before
        libc.free(ctypes.c_void_p(block))
print(json.dumps(mapped))
"""


def _mapped(sizes: list[int]) -> dict[int, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    done = subprocess.run(
        [sys.executable, "-c", SIZES, json.dumps(sizes)],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return {int(size): count for size, count in found.items()}


def test_an_adb_doors_frames_and_grpcs_read_blocks_are_recycled_in_the_heap() -> None:
    """THEN the blocks a relayed door frame takes (its bytes with their message and gRPC's
    framing) and those gRPC reads a socket into (64 KiB and a page) come from the heap
    again and again, never a fresh mapping faulted in page by page; a larger block (an
    upload's 256 KiB chunk) is still a mapping of its own, given back when freed."""
    frame = adb_pb2.AdbStreamsRequest(frame=adb_pb2.AdbFrame(stream=2**31, data=b"x" * CHUNK))
    relayed = len(frame.SerializeToString()) + 5  # gRPC's length prefix
    grpc_read = 64 * 1024 + 4096 - 16
    upload = 256 * 1024
    # Each in a process of its own: a block is carved from the heap's free top when that is
    # large enough, whatever its size, and the frames' churn leaves more than 256 KiB there.
    assert _mapped([relayed, grpc_read]) == {relayed: 0, grpc_read: 0}
    assert _mapped([upload]) == {upload: 20}
