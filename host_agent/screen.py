"""Drawing a phone screen without a graphics library: an RGB canvas of filled rectangles
and text in a 5 by 9 bitmap font, written out as a PNG with zlib. The simulated phones use
it for their screenshots, so a person looking at one sees a screen (an app, its title, its
button, which phone it is) rather than a flat block that looks like a broken image.

Everything here is deterministic: the same calls give the same bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

RGB = tuple[int, int, int]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Each glyph: 9 rows of 5 pixels, top to bottom, "/" between rows ("#" on); rows left out
# at the end are empty. Capitals and digits stand on rows 0-6, lower case on rows 2-6 with
# descenders on 7-8.
_FONT = {
    "A": ".###./#...#/#...#/#####/#...#/#...#/#...#",
    "B": "####./#...#/#...#/####./#...#/#...#/####.",
    "C": ".###./#...#/#..../#..../#..../#...#/.###.",
    "D": "####./#...#/#...#/#...#/#...#/#...#/####.",
    "E": "#####/#..../#..../####./#..../#..../#####",
    "F": "#####/#..../#..../####./#..../#..../#....",
    "G": ".###./#...#/#..../#.###/#...#/#...#/.####",
    "H": "#...#/#...#/#...#/#####/#...#/#...#/#...#",
    "I": ".###./..#../..#../..#../..#../..#../.###.",
    "J": "..###/...#./...#./...#./...#./#..#./.##..",
    "K": "#...#/#..#./#.#../##.../#.#../#..#./#...#",
    "L": "#..../#..../#..../#..../#..../#..../#####",
    "M": "#...#/##.##/#.#.#/#.#.#/#...#/#...#/#...#",
    "N": "#...#/#...#/##..#/#.#.#/#..##/#...#/#...#",
    "O": ".###./#...#/#...#/#...#/#...#/#...#/.###.",
    "P": "####./#...#/#...#/####./#..../#..../#....",
    "Q": ".###./#...#/#...#/#...#/#.#.#/#..#./.##.#",
    "R": "####./#...#/#...#/####./#.#../#..#./#...#",
    "S": ".####/#..../#..../.###./....#/....#/####.",
    "T": "#####/..#../..#../..#../..#../..#../..#..",
    "U": "#...#/#...#/#...#/#...#/#...#/#...#/.###.",
    "V": "#...#/#...#/#...#/#...#/#...#/.#.#./..#..",
    "W": "#...#/#...#/#...#/#.#.#/#.#.#/#.#.#/.#.#.",
    "X": "#...#/#...#/.#.#./..#../.#.#./#...#/#...#",
    "Y": "#...#/#...#/.#.#./..#../..#../..#../..#..",
    "Z": "#####/....#/...#./..#../.#.../#..../#####",
    "a": "...../...../.###./....#/.####/#...#/.####",
    "b": "#..../#..../####./#...#/#...#/#...#/####.",
    "c": "...../...../.###./#..../#..../#...#/.###.",
    "d": "....#/....#/.####/#...#/#...#/#...#/.####",
    "e": "...../...../.###./#...#/#####/#..../.###.",
    "f": "..##./.#..#/.#.../###../.#.../.#.../.#...",
    "g": "...../...../.####/#...#/#...#/.####/....#/.###.",
    "h": "#..../#..../#.##./##..#/#...#/#...#/#...#",
    "i": "..#../...../.##../..#../..#../..#../.###.",
    "j": "...#./...../..##./...#./...#./...#./#..#./.##..",
    "k": "#..../#..../#..#./#.#../##.../#.#../#..#.",
    "l": ".##../..#../..#../..#../..#../..#../.###.",
    "m": "...../...../##.#./#.#.#/#.#.#/#.#.#/#.#.#",
    "n": "...../...../#.##./##..#/#...#/#...#/#...#",
    "o": "...../...../.###./#...#/#...#/#...#/.###.",
    "p": "...../...../####./#...#/#...#/####./#..../#....",
    "q": "...../...../.####/#...#/#...#/.####/....#/....#",
    "r": "...../...../#.##./##..#/#..../#..../#....",
    "s": "...../...../.####/#..../.###./....#/####.",
    "t": ".#.../.#.../###../.#.../.#.../.#..#/..##.",
    "u": "...../...../#...#/#...#/#...#/#..##/.##.#",
    "v": "...../...../#...#/#...#/#...#/.#.#./..#..",
    "w": "...../...../#...#/#...#/#.#.#/#.#.#/.#.#.",
    "x": "...../...../#...#/.#.#./..#../.#.#./#...#",
    "y": "...../...../#...#/#...#/#...#/.####/....#/.###.",
    "z": "...../...../#####/...#./..#../.#.../#####",
    "0": ".###./#...#/#..##/#.#.#/##..#/#...#/.###.",
    "1": "..#../.##../..#../..#../..#../..#../.###.",
    "2": ".###./#...#/....#/...#./..#../.#.../#####",
    "3": "####./....#/....#/.###./....#/....#/####.",
    "4": "...#./..##./.#.#./#..#./#####/...#./...#.",
    "5": "#####/#..../####./....#/....#/#...#/.###.",
    "6": "..##./.#.../#..../####./#...#/#...#/.###.",
    "7": "#####/....#/...#./..#../.#.../.#.../.#...",
    "8": ".###./#...#/#...#/.###./#...#/#...#/.###.",
    "9": ".###./#...#/#...#/.####/....#/...#./.##..",
    " ": "",
    ".": "...../...../...../...../...../.##../.##..",
    ",": "...../...../...../...../...../.##../..#../.#...",
    ":": "...../.##../.##../...../.##../.##..",
    ";": "...../.##../.##../...../.##../..#../.#...",
    "-": "...../...../...../.###.",
    "_": "...../...../...../...../...../...../#####",
    "/": "....#/...#./...#./..#../.#.../.#.../#....",
    "@": ".###./#...#/#.###/#.#.#/#.###/#..../.###.",
    "(": "...#./..#../.#.../.#.../.#.../..#../...#.",
    ")": ".#.../..#../...#./...#./...#./..#../.#...",
    "'": "..#../..#../.#...",
    '"': ".#.#./.#.#.",
    "!": "..#../..#../..#../..#../..#../...../..#..",
    "?": ".###./#...#/....#/...#./..#../...../..#..",
    "#": ".#.#./.#.#./#####/.#.#./#####/.#.#./.#.#.",
    "=": "...../...../#####/...../#####",
    "+": "...../..#../..#../#####/..#../..#..",
    "*": "...../..#../#.#.#/.###./#.#.#/..#..",
    ">": "#..../.#.../..#../...#./..#../.#.../#....",
    "<": "....#/...#./..#../.#.../..#../...#./....#",
    "%": "##..#/##..#/...#./..#../.#.../#..##/#..##",
    "·": "...../...../...../..#..",
    # Anything else: an empty box, so a missing glyph shows as missing, not as a space.
    "\0": "#####/#...#/#...#/#...#/#...#/#...#/#####",
}
GLYPH_WIDTH, GLYPH_HEIGHT, GLYPH_GAP = 5, 9, 1


def _bitmap(pattern: str) -> tuple[tuple[int, int], ...]:
    """The (column, row) of each pixel a glyph sets."""
    rows = pattern.split("/") if pattern else []
    return tuple((x, y) for y, row in enumerate(rows) for x, c in enumerate(row) if c == "#")


_GLYPHS = {c: _bitmap(p) for c, p in _FONT.items()}


class Canvas:
    """An RGB image, every pixel `background` to start with."""

    def __init__(self, width: int, height: int, background: RGB) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(bytes(background) * width * height)

    def fill(self, x0: int, y0: int, x1: int, y1: int, rgb: RGB) -> None:
        """The rectangle from (x0, y0) to (x1, y1), exclusive, clipped to the canvas."""
        x0, x1 = max(0, x0), min(self.width, x1)
        if x1 <= x0:
            return
        run = bytes(rgb) * (x1 - x0)
        for y in range(max(0, y0), min(self.height, y1)):
            at = (y * self.width + x0) * 3
            self.pixels[at : at + len(run)] = run

    def text(self, x: int, y: int, text: str, rgb: RGB, scale: int = 2) -> int:
        """`text` with its top-left corner at (x, y); returns the x after it."""
        for char in text:
            for gx, gy in _GLYPHS.get(char, _GLYPHS["\0"]):
                px, py = x + gx * scale, y + gy * scale
                self.fill(px, py, px + scale, py + scale, rgb)
            x += (GLYPH_WIDTH + GLYPH_GAP) * scale
        return x

    def copy(self) -> Canvas:
        other = Canvas.__new__(Canvas)
        other.width, other.height, other.pixels = self.width, self.height, bytearray(self.pixels)
        return other

    def png(self, level: int = 9) -> bytes:
        """The canvas as a truecolour PNG (every scanline unfiltered), compressed at zlib
        `level` (1: fast, for live frames)."""
        return png_file(self.width, self.height, zlib.compress(self.scanlines(), level))

    def scanlines(self, first: int = 0, end: int | None = None) -> bytes:
        """Rows `first` to `end` (exclusive) as a PNG's raw scanlines (filter 0 each)."""
        stride = self.width * 3
        last = self.height if end is None else end
        return b"".join(
            b"\x00" + bytes(self.pixels[y * stride : (y + 1) * stride]) for y in range(first, last)
        )


def png_file(width: int, height: int, idat: bytes) -> bytes:
    """A truecolour 8-bit PNG of `width` x `height` whose zlib stream is `idat`."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def text_width(text: str, scale: int = 2) -> int:
    """How wide `text` is drawn, without the gap after its last glyph."""
    return max(0, len(text) * (GLYPH_WIDTH + GLYPH_GAP) * scale - GLYPH_GAP * scale)


def glyph_pixels(char: str) -> Iterator[tuple[int, int]]:
    """The (column, row) of the pixels `char` sets (for tests that read text back)."""
    yield from _GLYPHS.get(char, _GLYPHS["\0"])


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
