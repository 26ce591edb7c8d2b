"""Real image and audio payloads for multimodal trace rows (chat API, base64 data URLs).

A trace row says how many images a request carries and how many prompt
tokens they cost (``images``, ``image_tokens``), and how many seconds of
audio (``audio_s``). The replayer sends actual files of matching size so
that the server's vision/audio encoder does the work the trace describes:

* images: PNGs of side ``28 * round(sqrt(tokens per image))`` pixels,
  which Qwen2-VL-style encoders (one token per 28x28 pixels) turn into the
  trace's token count; fixed-size encoders (LLaVA: 576 tokens) resize
  anyway. Each image differs (a seeded first row), so no server-side
  multimodal cache can reuse one request's image for another, and the
  other rows are the same grey in every image of a size, so their
  compressed form is cached and an image costs well under a millisecond.
* audio: 16 kHz mono 16-bit WAV of the trace's duration (a seeded tone).
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import zlib
from functools import lru_cache

QWEN2VL_PIXELS_PER_TOKEN_SIDE = 28
AUDIO_RATE = 16_000
#: prompt tokens per second of audio of Qwen2-Audio-style encoders (one per 40 ms)
AUDIO_TOKENS_PER_S = 25


def image_side(tokens_per_image: int) -> int:
    """Square side in pixels that gives about ``tokens_per_image`` tokens (at least 56 px)."""
    return QWEN2VL_PIXELS_PER_TOKEN_SIDE * max(2, round(math.sqrt(max(tokens_per_image, 1))))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


@lru_cache(maxsize=32)
def _plain_rows(side: int) -> tuple[bytes, bytes]:
    """Rows 2..side of every image of this size (grey) as raw PNG scanlines and as a deflate stream."""
    raw = (b"\x00" + b"\x80" * (3 * side)) * (side - 1)
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    return raw, c.compress(raw) + c.flush(zlib.Z_FINISH)


def png_data_url(side: int, seed: int) -> str:
    """A ``side`` x ``side`` RGB PNG, unique per ``seed`` (its first row), as a data URL.

    Only the first row is compressed per image: it ends with a full flush, after
    which the cached deflate stream of the remaining rows is a valid
    continuation, and the checksum is computed over the whole raw image."""
    digest = hashlib.blake2b((seed & (2**64 - 1)).to_bytes(8, "little"), digest_size=64).digest()
    first = b"\x00" + (digest * (3 * side // 64 + 1))[:3 * side]
    rest_raw, rest_deflate = _plain_rows(side)
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    head = c.compress(first) + c.flush(zlib.Z_FULL_FLUSH)
    idat = b"\x78\x01" + head + rest_deflate + struct.pack(">I", zlib.adler32(rest_raw, zlib.adler32(first)))
    png = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
           + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def wav_base64(seconds: float, seed: int) -> str:
    """``seconds`` of a seeded sine tone as a base64 WAV (16 kHz, mono, 16-bit)."""
    n = max(1, round(seconds * AUDIO_RATE))
    freq = 200 + seed % 800
    period = [int(8000 * math.sin(2 * math.pi * freq * i / AUDIO_RATE)) for i in range(AUDIO_RATE // 10)]
    samples = struct.pack(f"<{len(period)}h", *period) * (n // len(period) + 1)
    data = samples[:2 * n]
    header = (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt "
              + struct.pack("<IHHIIHH", 16, 1, 1, AUDIO_RATE, AUDIO_RATE * 2, 2, 16)
              + b"data" + struct.pack("<I", len(data)))
    return base64.b64encode(header + data).decode()
