"""What the CLI prints: the end-of-run summary, sample outputs, and fleet job status.

Kept apart from the command definitions so the wording and layout of results live in one
place, and so tests can check the numbers without parsing argument handling.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from connectors import read_part_head
from pipeline.shard_outcome import entry_has_part, entry_part_id

_STATUS_STYLE = {
    "succeeded": "green", "done": "green", "skipped": "green", "completed_with_errors": "yellow",
    "cancelled": "yellow", "cancelling": "yellow", "failed": "red", "queued": "dim",
}


def _style(status: str) -> str:
    return _STATUS_STYLE.get(status, "cyan")


def read_samples(manifest: dict[str, Any], storage_options: dict[str, Any] | None, count: int) -> list[dict[str, Any]]:
    """Up to ``count`` rows (id, output, error) from the first written parts: no full read of a big job."""
    samples: list[dict[str, Any]] = []
    for shard in manifest.get("shards", []):
        if len(samples) >= count:
            break
        if not entry_has_part(shard):
            continue
        samples += read_part_head(
            manifest["output_url"], entry_part_id(shard), ["id", "output", "error"], count - len(samples),
            storage_options,
        )
    return samples


def _rows(totals: dict[str, Any]) -> str:
    """The rows and where they came from (manifests before issue 41 have the total only)."""
    if "rows_computed" not in totals:
        return f"{totals['rows']:,}"
    return (f"{totals['rows']:,} ({totals['rows_computed']:,} computed, {totals['rows_resumed']:,} resumed from a "
            f"checkpoint, {totals['rows_reused']:,} reused from the previous run's parts, "
            f"{totals['rows_shared']:,} shared with an identical row, {totals['rows_current']:,} in parts already "
            "current)")


def _kind_lines(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The kind's own lines from the manifest's summary (none for a kind this process lacks)."""
    from jobs.kinds import job_kind

    summary = manifest.get("summary") or {}
    if not isinstance(summary, dict):
        return []
    try:
        kind = job_kind(manifest.get("kind", ""))
    except ValueError:
        return []
    return kind.console_lines(summary) if hasattr(kind, "console_lines") else []


def run_summary(manifest: dict[str, Any]) -> Table:
    totals, stats = manifest["totals"], manifest.get("engine_stats") or {}
    table = Table(title=f"{manifest['name']} ({manifest['kind']})", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    status = manifest["status"]
    table.add_row("status", f"[{_style(status)}]{status}[/]")
    shards = (f"{totals['shards']} ({totals['shards_done']} done, {totals['shards_skipped']} already current, "
              f"{totals['shards_failed']} failed)")
    table.add_row("shards", shards)
    table.add_row("rows", _rows(totals))
    table.add_row("row errors", f"{totals['errors']:,}")
    table.add_row("output tokens", f"{totals['output_tokens']:,}")
    table.add_row("tokens/s", f"{stats.get('output_tokens_per_s', 0.0):,.1f} (tokens this run computed)")
    table.add_row("KV peak use", f"{stats.get('kv_peak_usage', 0.0):.0%}")
    table.add_row("prefix hit tokens", f"{stats.get('prefix_cache_hit_tokens', 0):,}")
    table.add_row("elapsed", f"{stats.get('elapsed_s', 0.0):.1f}s")
    for label, value in _kind_lines(manifest):
        table.add_row(label, value)
    for shard in manifest.get("shards", []):
        if shard["status"] == "failed":
            table.add_row(f"shard {shard['index']} failed", f"[red]{shard.get('reason')}[/]")
    return table


def output_lines(manifest: dict[str, Any], extra: dict[str, str] | None = None) -> list[str]:
    """Where the results are, one unwrapped line each (so they can be copied)."""
    lines = [f"output: {manifest['output_url']}  (part-*.parquet, _manifest.json)"]
    openai = (manifest.get("summary") or {}).get("openai_output")
    if openai:
        lines.append(f"openai output: {openai['url']}  ({openai['lines']} lines, {openai['errors']} errors)")
    lines += [f"{label}: {url}" for label, url in (extra or {}).items()]
    return lines


def samples_table(samples: list[dict[str, Any]], width: int = 400) -> Table:
    table = Table(title="sample outputs", title_justify="left", show_lines=True)
    table.add_column("id", style="bold", no_wrap=True)
    table.add_column("output")
    for row in samples:
        text = row["output"] if not row.get("error") else f"[red]error: {row['error']}[/]"
        text = " ".join((text or "").split())
        table.add_row(str(row["id"]), text if len(text) <= width else text[: width - 1] + "…")
    return table


def print_run(console: Console, manifest: dict[str, Any], samples: list[dict[str, Any]],
              extra: dict[str, str] | None = None) -> None:
    console.print(run_summary(manifest))
    if manifest.get("error"):  # one unwrapped line: it names the commonest error whole
        console.print(f"error: {manifest['error']}", soft_wrap=True, markup=False, highlight=False, style="red")
    for line in output_lines(manifest, extra):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if samples:
        console.print(samples_table(samples))


def status_table(state: dict[str, Any]) -> Table:
    p = state["progress"]
    title = (f"{state['job_id']} ({state.get('name')}): [{_style(state['status'])}]{state['status']}[/]  "
             f"{p['shards_done'] + p['shards_skipped']}/{p['shards_total']} shards, {p['rows_done']:,} rows, "
             f"{p['errors']:,} errors, {p['tokens_per_s']:,.1f} tok/s")
    table = Table(title=title, title_justify="left")
    for column in ("shard", "state", "rows", "errors", "tokens", "worker", "reason"):
        table.add_column(column, justify="right" if column in ("shard", "rows", "errors", "tokens") else "left")
    for s in state["shards"]:
        table.add_row(
            str(s["index"]), f"[{_style(s['state'])}]{s['state']}[/]", f"{s['rows_done']:,}", f"{s['errors']:,}",
            f"{s['output_tokens']:,}", s.get("worker") or "", s.get("reason") or "",
        )
    return table
