"""The public trace formats ``llmlb trace import`` reads, by name, and the check of a format name.

Kept apart from the importers (numpy, pyarrow) so that ``llmlb trace import --help``, which lists
the formats, and a mistyped format's error need none of them; the error itself loads on the
error path, so that the ``trace`` commands' help pages need no TOML module either.
"""

from __future__ import annotations

FORMATS = {
    "azure-2023": "Azure LLM inference trace 2023 (Splitwise): TIMESTAMP, ContextTokens, GeneratedTokens",
    "azure-2024": "Azure LLM inference trace 2024 (week-long): same columns, +00:00 timestamps",
    "azure-mm-2025": "Azure multimodal trace 2025: adds NumImages, ISO ...Z timestamps",
    "burstgpt": "BurstGPT releases 1-3 (CSV; Session ID / Elapsed time in release 3)",
    "mooncake": "Mooncake FAST'25 JSONL (ms timestamps, 512-token chained hash ids)",
    "bailian": "Qwen-Bailian JSONL (chat_id, parent_chat_id, turn, type, 16-token hash ids)",
    "servegen": "ServeGen per-client window parameters (a directory or one chunk-<client>-trace.csv)",
    "sharegpt": "ShareGPT-style JSON conversations (lengths; arrivals from --rate/--process)",
}


def check_format(fmt: str) -> None:
    """Refuse a format none of the importers reads, naming the closest one."""
    if fmt not in FORMATS:
        from llmlb_bench.tomlfile import unknown_choice

        raise unknown_choice("format", fmt, FORMATS, "trace import")
