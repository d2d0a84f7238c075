"""Storage connectors: the only code in tokenmill that touches storage.

Plain arguments only (URLs, storage_options, tables); nothing here knows about the
engine, Celery or job specs.
"""

from connectors.manifest import (
    read_manifest,
    success_marker_exists,
    write_bytes,
    write_manifest,
    write_success_marker,
    write_text,
)
from connectors.parquet_sink import (
    PartWriter,
    part_is_current,
    part_name,
    part_url,
    read_part_columns,
    read_part_footer,
    read_part_head,
    read_parts,
    write_part,
)
from connectors.records import Record, ShardReadError, read_records
from connectors.shards import ShardRef, detect_format, list_shards
from connectors.storage import StorageError, filesystem_for, is_transient, join_url, with_retries

__all__ = [
    "PartWriter",
    "Record",
    "ShardReadError",
    "ShardRef",
    "StorageError",
    "detect_format",
    "filesystem_for",
    "is_transient",
    "join_url",
    "list_shards",
    "part_is_current",
    "part_name",
    "part_url",
    "read_manifest",
    "read_part_columns",
    "read_part_footer",
    "read_part_head",
    "read_parts",
    "read_records",
    "success_marker_exists",
    "with_retries",
    "write_bytes",
    "write_manifest",
    "write_part",
    "write_success_marker",
    "write_text",
]
