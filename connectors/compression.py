"""Streaming decompression of input shards (gzip, zstd) into buffered byte streams.

gzip comes from the standard library. For zstd, `zstandard`'s stream_reader and
read_to_iter silently return nothing for a truncated frame, which would turn a cut-off
upload into an "empty" shard; `_ZstdStream` drives `decompressobj` frame by frame
instead so truncation raises like a truncated gzip does.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO

import zstandard

READ_BUFFER = 1 << 20
# Compressed bytes fed per decompress call; keeps each call's output (and memory) small.
_ZSTD_INPUT_CHUNK = 1 << 16

CORRUPT_DATA_ERRORS: tuple[type[BaseException], ...] = (
    gzip.BadGzipFile,
    EOFError,
    zlib.error,
    zstandard.ZstdError,
)


class _ZstdStream(io.RawIOBase):
    """Raw stream over concatenated zstd frames; EOFError if the last frame is incomplete."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self._dctx = zstandard.ZstdDecompressor()
        self._frame = self._dctx.decompressobj()
        self._in_frame = False
        self._out = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._out:
            data = self._source.read(_ZSTD_INPUT_CHUNK)
            if not data:
                if self._in_frame:
                    raise EOFError("zstd data ended in the middle of a frame (truncated file?)")
                return 0
            self._out = memoryview(self._decompress(data))
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _decompress(self, data: bytes) -> bytes:
        parts = []
        while data:
            self._in_frame = True
            parts.append(self._frame.decompress(data))
            if not self._frame.eof:
                break
            # Frame complete: the rest of `data` (if any) starts the next frame.
            data = self._frame.unused_data
            self._frame = self._dctx.decompressobj()
            self._in_frame = False
        return b"".join(parts)


def open_decompressed(raw: IO[bytes], compression: str | None) -> IO[bytes]:
    """A buffered stream of `raw`'s decompressed bytes (with readline); the caller closes `raw`.

    Raises ValueError for an unknown compression name.
    """
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "zstd":
        return io.BufferedReader(_ZstdStream(raw), READ_BUFFER)
    if compression is None:
        return io.BufferedReader(raw, READ_BUFFER)  # type: ignore[arg-type]
    raise ValueError(f"unsupported compression {compression!r}")
