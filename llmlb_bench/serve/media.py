"""Prompt tokens of images and audio in chat messages, as the replayer sizes them.

The replayer (:mod:`llmlb_bench.replay.media`) sends a multimodal trace row's
images as PNG data URLs sized for a Qwen2-VL-style encoder (one token per
28 x 28 pixels) and its audio as 16 kHz WAV (25 tokens per second, one per
40 ms, as Qwen2-Audio), and shortens the text by those tokens. The server
counts them back the same way: a PNG's size from its header, a WAV's
duration from its header and length. Other images (URLs, other formats)
count 576 tokens, a fixed-size encoder's (LLaVA-1.5) count.

Each media token gets an id derived from the payload, so the prefix cache
shares identical images and audio across requests (as vLLM hashes
multimodal inputs) and never mixes different ones.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
import zlib
from typing import Mapping

from llmlb_bench.replay.media import AUDIO_TOKENS_PER_S, QWEN2VL_PIXELS_PER_TOKEN_SIDE
from llmlb_bench.serve.tokenizer import VOCAB_SIZE

#: tokens of an image whose size cannot be read (a fixed-size encoder's count)
DEFAULT_IMAGE_TOKENS = 576
_PNG = b"\x89PNG\r\n\x1a\n"


class MediaError(ValueError):
    """A media part that cannot be read (the API answers 400)."""


def _payload_id(data: str) -> int:
    return zlib.crc32(data.encode()) % VOCAB_SIZE


def image_tokens(url: str) -> int:
    """Tokens of one image: ``ceil(w / 28) x ceil(h / 28)`` for a PNG data URL, else the default."""
    head, sep, data = url.partition(",")
    if not (sep and head.startswith("data:image/png") and head.endswith(";base64")):
        return DEFAULT_IMAGE_TOKENS
    try:
        raw = base64.b64decode(data[:32])
    except (binascii.Error, ValueError):
        raise MediaError("an image data URL is not valid base64") from None
    if len(raw) < 24 or raw[:8] != _PNG or raw[12:16] != b"IHDR":
        raise MediaError("an image/png data URL does not hold a PNG")
    width: int
    height: int
    width, height = struct.unpack(">II", raw[16:24])
    side = QWEN2VL_PIXELS_PER_TOKEN_SIDE
    return math.ceil(width / side) * math.ceil(height / side)


def audio_tokens(data: str) -> int:
    """Tokens of base64 WAV audio: its duration x 25 per second, rounded."""
    try:
        head = base64.b64decode(data[:64])
    except (binascii.Error, ValueError):
        raise MediaError("input_audio data is not valid base64") from None
    if len(head) < 44 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise MediaError("input_audio data is not a WAV file")
    byte_rate = struct.unpack("<I", head[28:32])[0]
    size = len(data) * 3 // 4 - data[-2:].count("=") - 44
    return round(size / byte_rate * AUDIO_TOKENS_PER_S) if byte_rate else 0


def part_ids(part: Mapping[str, object]) -> list[int]:
    """Token ids of one non-text content part (image_url or input_audio); [] for other kinds."""
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise MediaError("an image_url part needs a url")
        return [_payload_id(url)] * image_tokens(url)
    if kind == "input_audio":
        audio = part.get("input_audio")
        data = audio.get("data") if isinstance(audio, dict) else None
        if not isinstance(data, str):
            raise MediaError("an input_audio part needs base64 data")
        return [_payload_id(data)] * audio_tokens(data)
    return []
