"""Incremental Server-Sent Events decoding, as OpenAI-compatible servers stream it.

Bytes arrive in arbitrary pieces (a TCP read may end inside an event); the
decoder keeps the unfinished tail and returns only complete events. Only the
fields the replayer needs are kept: ``event`` (servers that name an error
event) and the joined ``data`` lines; comments (``: ping``) are dropped.
"""

from __future__ import annotations


class SSEDecoder:
    """Feed bytes, get ``(event, data)`` pairs of complete events."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            # CRLF line ends: normalise, but keep a trailing CR that may pair with the next read's LF
            keep_cr = buf.endswith(b"\r")
            buf = (buf[:-1] if keep_cr else buf).replace(b"\r\n", b"\n") + (b"\r" if keep_cr else b"")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 2:]
        events = []
        for block in buf[:end].split(b"\n\n"):
            if block.startswith(b"data:") and b"\n" not in block:  # the common one-line event
                events.append((b"", block[6:] if block[5:6] == b" " else block[5:]))
                continue
            name = b""
            parts: list[bytes] = []
            for line in block.split(b"\n"):
                field, _, value = line.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if field == b"data":
                    parts.append(value)
                elif field == b"event":
                    name = value
            if parts:
                events.append((name, b"\n".join(parts)))
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (non-empty at stream end means truncation)."""
        return self._buf.strip()
