"""Storage connectors: the only code in tokenmill that touches storage.

Plain arguments only (URLs, storage_options, Arrow tables, JSON-safe dicts and lines);
nothing here knows about the engine, Celery or job specs. Storage formats live here too:
file names, Parquet footer keys, JSONL serialisation.
"""

from connectors.checkpoints import LoadedChunk, ShardCheckpoint, checkpoint_url
from connectors.credentials import CredentialError, literal_credentials
from connectors.jsonl_files import file_set_is_current, holds_text, read_lines, write_file_set
from connectors.lease import (
    Lease,
    OutputLeased,
    acquire_lease,
    check_lease,
    read_lease,
    release_lease,
    renew_lease,
)
from connectors.manifest import (
    read_manifest,
    remove_optional,
    remove_success_marker,
    success_marker_exists,
    write_bytes,
    write_manifest,
    write_success_marker,
    write_text,
)
from connectors.parquet_sink import (
    PartId,
    PartWriter,
    part_id_of,
    part_is_current,
    part_name,
    part_url,
    read_part_footer,
    read_part_result,
    remove_stale_parts,
    write_part,
)
from connectors.part_identity import read_part_commit
from connectors.part_lines import (
    MergedLines,
    encode_part_lines,
    lines_sha256,
    merge_part_lines,
    part_lines_are_current,
    part_lines_url,
    read_part_lines,
    write_part_lines,
)
from connectors.part_reads import (
    iter_part_column,
    list_part_sizes,
    read_part_columns,
    read_part_head,
    read_part_if_any,
    read_parts,
)
from connectors.records import Record, ShardReadError, read_records
from connectors.shards import ShardRef, detect_format, list_shards
from connectors.storage import (
    StorageError,
    filesystem_for,
    has_userinfo,
    is_transient,
    join_url,
    public_url,
    with_retries,
)

__all__ = [
    "CredentialError",
    "Lease",
    "LoadedChunk",
    "MergedLines",
    "OutputLeased",
    "PartId",
    "PartWriter",
    "Record",
    "ShardCheckpoint",
    "ShardReadError",
    "ShardRef",
    "StorageError",
    "acquire_lease",
    "check_lease",
    "checkpoint_url",
    "detect_format",
    "encode_part_lines",
    "file_set_is_current",
    "filesystem_for",
    "has_userinfo",
    "holds_text",
    "is_transient",
    "join_url",
    "lines_sha256",
    "list_shards",
    "literal_credentials",
    "merge_part_lines",
    "part_id_of",
    "part_is_current",
    "part_lines_are_current",
    "part_lines_url",
    "part_name",
    "part_url",
    "public_url",
    "read_lease",
    "read_lines",
    "read_manifest",
    "remove_optional",
    "list_part_sizes",
    "read_part_lines",
    "iter_part_column",
    "read_part_columns",
    "read_part_commit",
    "read_part_footer",
    "read_part_head",
    "read_part_if_any",
    "read_part_result",
    "read_parts",
    "read_records",
    "release_lease",
    "remove_stale_parts",
    "remove_success_marker",
    "renew_lease",
    "success_marker_exists",
    "with_retries",
    "write_bytes",
    "write_file_set",
    "write_manifest",
    "write_part",
    "write_part_lines",
    "write_success_marker",
    "write_text",
]
