"""The evaluation report: ``report.md`` and a ``report.png`` bar chart next to the output.

Written from the manifest alone (its ``summary`` holds the scores), so it can be made
after an embedded run or for a finished fleet job without reading the parts again.
matplotlib is optional: without it the Markdown is written and says why there is no chart.
"""

from __future__ import annotations

import io
from typing import Any

from connectors import join_url, write_bytes, write_text

REPORT_MD = "report.md"
REPORT_PNG = "report.png"


def _chart(summary: dict[str, Any], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_ref = summary.get("by_reference") or {}
    panels = 2 if by_ref else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.6), squeeze=False)
    try:
        labels = ["correct", "incorrect", "errors"]
        values = [summary.get("correct", 0), summary.get("incorrect", 0), summary.get("errors", 0)]
        ax = axes[0][0]
        bars = ax.bar(labels, values, color=["#2e7d32", "#c62828", "#757575"])
        ax.bar_label(bars)
        accuracy = summary.get("accuracy")
        ax.set_title(f"{title}: accuracy {accuracy:.1%}" if accuracy is not None else title)
        ax.set_ylabel("rows")
        if by_ref:
            ax = axes[0][1]
            names = list(by_ref)
            ax.bar(names, [by_ref[n]["accuracy"] for n in names], color="#1565c0")
            ax.set_ylim(0, 1)
            ax.set_title("accuracy by reference answer")
            ax.tick_params(axis="x", labelrotation=45 if len(names) > 6 else 0)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()
    finally:
        plt.close(fig)


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _loglikelihood_lines(summary: dict[str, Any]) -> list[str]:
    """acc / acc_norm with their bootstrap standard errors (method loglikelihood), pass@k (n samples)."""
    lines = []
    for name in ("acc", "acc_norm"):
        if summary.get(name) is not None:
            lines.append(f"- {name}: {summary[name]:.4f} ± {_fmt(summary.get(name + '_stderr'))} (bootstrap s.e.)")
    for k, value in (summary.get("pass_at_k") or {}).items():
        lines.append(f"- pass@{k}: {value:.4f}")
    if summary.get("majority_accuracy") is not None:
        lines.append(f"- majority-vote accuracy: {summary['majority_accuracy']:.4f}")
    return lines


def render_markdown(manifest: dict[str, Any], chart: bool) -> str:
    summary = manifest.get("summary") or {}
    stats = manifest.get("engine_stats") or {}
    accuracy = summary.get("accuracy")
    lines = [
        f"# Evaluation report: {manifest.get('name')}",
        "",
        f"- job: `{manifest.get('job_id')}` ({manifest.get('status')}, {manifest.get('mode')})",
        f"- model: `{manifest.get('model')}`",
        f"- input: `{manifest.get('input_url')}`",
        f"- scoring: `{summary.get('method', 'n/a')}`",
        f"- **accuracy: {accuracy:.2%}**" if accuracy is not None else "- accuracy: n/a (nothing scored)",
        *_loglikelihood_lines(summary),
        "",
        "| rows | scored | correct | incorrect | errors | output tokens/s | prefix-cache hit tokens |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        "| " + " | ".join(_fmt(v) for v in (
            summary.get("rows"), summary.get("scored"), summary.get("correct"), summary.get("incorrect"),
            summary.get("errors"), stats.get("output_tokens_per_s"), stats.get("prefix_cache_hit_tokens"),
        )) + " |",
    ]
    by_ref = summary.get("by_reference") or {}
    if by_ref:
        lines += ["", "| reference | scored | correct | accuracy |", "|---|---:|---:|---:|"]
        lines += [f"| {ref} | {v['scored']} | {v['correct']} | {v['accuracy']:.1%} |" for ref, v in by_ref.items()]
    if "error" in summary:
        lines += ["", f"Scoring failed: {summary['error']}"]
    lines += ["", f"![scores]({REPORT_PNG})" if chart else "(no chart: matplotlib is not installed)", ""]
    return "\n".join(lines)


def write_report(manifest: dict[str, Any], storage_options: dict[str, Any] | None = None) -> dict[str, str]:
    """Write the report into the job's output; returns {"markdown": url, "chart": url (if drawn)}."""
    output_url = manifest["output_url"]
    written: dict[str, str] = {}
    try:
        png = _chart(manifest.get("summary") or {}, str(manifest.get("name")))
    except ImportError:
        png = None
    if png is not None:
        written["chart"] = join_url(output_url, REPORT_PNG)
        write_bytes(written["chart"], png, storage_options)
    written["markdown"] = join_url(output_url, REPORT_MD)
    write_text(written["markdown"], render_markdown(manifest, chart=png is not None), storage_options)
    return written
