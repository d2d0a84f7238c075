"""A part's identity beyond its name: the commit id its writer put in its footer.

Each write of a part gets a fresh id (``PartWriter.commit_id``). The manifest records the id
of every part it lists, so a part that another run replaced under the same name (same
input, same plan, other rows) is told apart by one footer read.
"""

from __future__ import annotations

from connectors.parquet_sink import COMMIT_KEY, PartId, read_part_footer


def read_part_commit(output_url: str, part: PartId, storage_options: dict | None = None) -> str | None:
    """The commit id in the part's footer; None if there is no part or it has no id (an
    older or foreign file)."""
    try:
        value = read_part_footer(output_url, part, storage_options).get(COMMIT_KEY)
    except FileNotFoundError:
        return None
    return value.decode("ascii", "replace") if value else None
