"""Images and audio per request, turned into prompt tokens by the model's own rule.

* ``llava``: LLaVA-1.5 resizes every image to 336x336 and a CLIP ViT-L/14
  makes 24x24 = 576 tokens, whatever the input resolution.
* ``qwen2-vl``: Qwen2-VL resizes the image to multiples of 28 pixels keeping
  the aspect ratio and the pixel count within [min_pixels, max_pixels]
  (``smart_resize`` in its image processor; defaults 56x56 and
  16384x28x28 from its preprocessor config), then emits one token per 28x28
  pixels (14-pixel patches merged 2x2).
* ``fixed``: ``tokens_per_image`` for any other encoder.
* ``total``: the image tokens of a request (with at least one image) drawn
  from ``image_tokens``, for measured distributions such as ServeGen's.

Audio seconds become ``audio_tokens_per_s`` tokens per second (25 for
Qwen2-Audio, whose encoder emits one token per 40 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmlb_bench.workload.distributions import Distribution, Lengths, parse_distribution, parse_lengths
from llmlb_bench.workload.fields import Section

QWEN2VL_FACTOR = 28
QWEN2VL_MIN_PIXELS = 56 * 56
QWEN2VL_MAX_PIXELS = 16384 * 28 * 28
LLAVA_TOKENS = 576


def qwen2vl_tokens(width: np.ndarray, height: np.ndarray, min_pixels: int = QWEN2VL_MIN_PIXELS,
                   max_pixels: int = QWEN2VL_MAX_PIXELS) -> np.ndarray:
    """Image tokens of Qwen2-VL for images of the given sizes (vectorised ``smart_resize``)."""
    f = QWEN2VL_FACTOR
    w = np.asarray(width, dtype=float)
    h = np.asarray(height, dtype=float)
    hb = np.maximum(f, np.round(h / f) * f)
    wb = np.maximum(f, np.round(w / f) * f)
    big = hb * wb > max_pixels
    small = hb * wb < min_pixels
    beta = np.sqrt(h * w / max_pixels)
    hb = np.where(big, np.floor(h / beta / f) * f, hb)
    wb = np.where(big, np.floor(w / beta / f) * f, wb)
    beta = np.sqrt(min_pixels / (h * w))
    hb = np.where(small, np.ceil(h * beta / f) * f, hb)
    wb = np.where(small, np.ceil(w * beta / f) * f, wb)
    return (hb * wb / (f * f)).astype(np.int64)


@dataclass(frozen=True)
class Multimodal:
    """What a tenant attaches to each request: images (count, sizes, rule) and audio."""

    images: Lengths | None
    rule: str
    tokens_per_image: int
    image_tokens: Lengths | None
    resolutions: np.ndarray | None  # (k, 2) width, height
    resolution_probs: np.ndarray | None
    width: Distribution | None
    height: Distribution | None
    min_pixels: int
    max_pixels: int
    audio_s: Distribution | None
    audio_tokens_per_s: float

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per request: image count, image tokens, audio seconds, audio tokens."""
        count = self.images.sample(rng, n).astype(np.int64) if self.images else np.zeros(n, np.int64)
        tokens = np.zeros(n, dtype=np.int64)
        total = int(count.sum())
        if total:
            owner = np.repeat(np.arange(n), count)
            if self.rule == "qwen2-vl":
                if self.resolutions is not None:
                    pick = rng.choice(len(self.resolutions), size=total, p=self.resolution_probs)
                    w, h = self.resolutions[pick, 0], self.resolutions[pick, 1]
                else:
                    assert self.width is not None and self.height is not None
                    w, h = self.width.sample(rng, total), self.height.sample(rng, total)
                per_image = qwen2vl_tokens(np.maximum(w, 1), np.maximum(h, 1), self.min_pixels, self.max_pixels)
            elif self.rule == "total":
                assert self.image_tokens is not None
                tokens = np.where(count > 0, self.image_tokens.sample(rng, n), 0).astype(np.int64)
            else:
                per_image = np.full(total, self.tokens_per_image, dtype=np.int64)
            if self.rule != "total":
                tokens = np.bincount(owner, weights=per_image, minlength=n).astype(np.int64)
        if self.audio_s is not None:
            audio = np.maximum(self.audio_s.sample(rng, n), 0.0)
        else:
            audio = np.zeros(n)
        audio_tokens = np.rint(audio * self.audio_tokens_per_s).astype(np.int64)
        return count, tokens, audio, audio_tokens


def parse_multimodal(s: Section) -> Multimodal:
    images = s.section("images", None)
    rule = s.string("rule", "qwen2-vl", choices=("llava", "qwen2-vl", "fixed", "total"))
    tokens_per_image = LLAVA_TOKENS
    if rule == "fixed":
        tokens_per_image = s.integer("tokens_per_image", ge=1)
    image_tokens = parse_lengths(s.section("image_tokens"), default_min=0) if rule == "total" else None
    resolutions = probs = None
    width = height = None
    if rule == "qwen2-vl" and images is not None:
        if s.has("resolutions"):
            rows = s.raw("resolutions")
            if not isinstance(rows, list) or not rows or not all(isinstance(r, list) and len(r) == 2 for r in rows):
                raise s.error("resolutions", "expected a list of [width, height] pairs")
            flat = Section({"v": [x for r in rows for x in r]}, s.dotted("resolutions"), s.source).numbers("v", gt=0)
            resolutions = np.asarray(flat).reshape(-1, 2)
            p = np.asarray(s.numbers("resolution_probs", [1.0] * len(rows), ge=0))
            if len(p) != len(rows) or p.sum() <= 0:
                raise s.error("resolution_probs", f"needs {len(rows)} non-negative weights, not all zero")
            probs = p / p.sum()
        else:
            width = parse_distribution(s.section("width"))
            height = parse_distribution(s.section("height"))
    out = Multimodal(
        images=parse_lengths(images, default_min=0) if images is not None else None,
        rule=rule, tokens_per_image=tokens_per_image, image_tokens=image_tokens, resolutions=resolutions, resolution_probs=probs,
        width=width, height=height,
        min_pixels=s.integer("min_pixels", QWEN2VL_MIN_PIXELS, ge=1),
        max_pixels=s.integer("max_pixels", QWEN2VL_MAX_PIXELS, ge=QWEN2VL_FACTOR**2),
        audio_s=parse_distribution(s.section("audio_s")) if s.has("audio_s") else None,
        audio_tokens_per_s=s.number("audio_tokens_per_s", 25.0, gt=0),
    )
    if out.min_pixels > out.max_pixels:
        raise s.error("min_pixels", f"must be <= max_pixels ({out.max_pixels})")
    s.finish()
    return out
