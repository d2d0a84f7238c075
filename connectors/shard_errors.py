"""When a whole shard cannot be read: ``ShardReadError``, and which read failures become one.

Permanent failures (missing, denied, corrupt, malformed) become ``ShardReadError`` naming
the shard; transient storage errors pass through unchanged so the caller can retry the shard.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow as pa

from connectors.compression import CORRUPT_DATA_ERRORS
from connectors.shards import ShardRef
from connectors.storage import StorageError, is_transient


class ShardReadError(StorageError):
    """The whole shard cannot be read (missing, denied, corrupt, lacking the text column)."""


def unreadable(shard: ShardRef, reason: str) -> ShardReadError:
    """The error for ``shard`` with ``reason`` (for the caller to raise)."""
    return ShardReadError(f"cannot read shard {shard.url}: {reason}", shard.url)


@contextmanager
def shard_errors(shard: ShardRef) -> Iterator[None]:
    """Turn permanent read failures into ShardReadError; let transient ones through for a retry."""
    try:
        yield
    except ShardReadError:
        raise
    except FileNotFoundError as exc:
        raise unreadable(shard, "no such file") from exc
    except PermissionError as exc:
        raise unreadable(shard, f"access denied ({exc})") from exc
    except CORRUPT_DATA_ERRORS as exc:
        raise unreadable(shard, f"corrupt or truncated {shard.compression or 'compressed'} data ({exc})") from exc
    except csv.Error as exc:
        raise unreadable(shard, f"malformed CSV ({exc})") from exc
    except pa.ArrowException as exc:
        raise unreadable(shard, f"unreadable {shard.format} data ({exc})") from exc
    except OSError as exc:
        if is_transient(exc):
            raise
        raise unreadable(shard, f"{type(exc).__name__}: {exc}") from exc
