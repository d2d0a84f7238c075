"""Summary and tables of a bench_engine run: medians of the alternating runs, ratios per
dtype and workload, distance to the same-run matmul ceiling and to the physical limit."""

from __future__ import annotations

import statistics

import sysinfo


def _median(rows, key="output_tok_s"):
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else None


def summarise(result: dict) -> list[dict]:
    rows, out = result["rows"], []
    for phase in result["phases"]:
        dtype = phase["dtype"]
        for name, lim in phase["limits"].items():
            wl = result["workloads"][name]
            sel = [r for r in rows if r["workload"] == name and r["dtype"] == dtype]
            tm = [r for r in sel if r["engine"] == "tokenmill"]
            off = [r for r in sel if r["engine"] == "tokenmill, prefix cache off"]
            vl = [r for r in sel if r["engine"] == "vLLM"]
            s = {"workload": name, "dtype": dtype, "tokenmill": _median(tm), "runs": len(tm),
                 "tokenmill_gflops": _median(tm, "gflops"), "matmul_gflops": phase["matmul_gflops"],
                 "ceiling_gflops": phase.get("ceiling_gflops", phase["matmul_gflops"]),
                 "matmul_gflops_float32": phase["matmul_gflops_float32"],
                 "limit_tok_s": lim["limit_output_tok_s"]}
            s["gflops_of_ceiling"] = s["tokenmill_gflops"] / s["ceiling_gflops"]
            s["tokenmill_of_limit"] = s["tokenmill"] / s["limit_tok_s"]
            if vl:
                pairs = [a["output_tok_s"] / b["output_tok_s"] for a, b in zip(tm, vl, strict=False)]
                s |= {"vllm": _median(vl), "ratio": statistics.median(pairs), "ratio_each": pairs,
                      "vllm_of_limit": _median(vl) / s["limit_tok_s"], "vllm_prefix_hit_tokens": _median(vl, "prefix_hit_tokens")}
            if off:
                shared = wl["requests"] * wl["shared_prefix"]
                s |= {"prefix_off": _median(off),
                      "prefix_speedup": statistics.median(a["output_tok_s"] / b["output_tok_s"]
                                                          for a, b in zip(tm, off, strict=False)),
                      "prefix_hit_tokens": _median(tm, "prefix_hit_tokens"),
                      "shared_tokens": shared, "shared_served": _median(tm, "prefix_hit_tokens") / shared}
                if vl:
                    s["vllm_shared_served"] = s["vllm_prefix_hit_tokens"] / shared
            out.append(s)
    hf = [r for r in rows if r["engine"].startswith("HF")]
    for r in hf:
        tm = [x for x in rows if x["workload"] == r["workload"] and x["engine"] == "tokenmill"]
        out.append({"workload": r["workload"], "dtype": r["dtype"], "tokenmill": tm[0]["output_tok_s"],
                    "hf": r["output_tok_s"], "ratio_hf": tm[0]["output_tok_s"] / r["output_tok_s"]})
    return out


def _f(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def print_tables(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    head = sysinfo.describe(result["machine"])
    con = Console(width=220)
    t = Table(title=f"tokenmill vs vLLM (output tok/s, medians of alternating runs)\n{head}")
    for c in ("workload", "dtype", "runs", "tokenmill", "vLLM", "ratio", "GFLOP/s (ceiling)", "% ceiling",
              "limit tok/s", "tm % limit", "vLLM % limit"):
        t.add_column(c)
    for s in result["summary"]:
        if "hf" in s:
            continue
        t.add_row(s["workload"], s["dtype"], str(s["runs"]), _f(s["tokenmill"]), _f(s.get("vllm")),
                  _f(s.get("ratio"), ".2f"), f"{s['tokenmill_gflops']:.0f} ({s['ceiling_gflops']:.0f})",
                  f"{s['gflops_of_ceiling']:.0%}", _f(s["limit_tok_s"]), f"{s['tokenmill_of_limit']:.0%}",
                  _f(s.get("vllm_of_limit"), ".0%"))
    con.print(t)
    t = Table(title=f"prefix cache on the 8-shot set\n{head}")
    for c in ("dtype", "tokenmill on", "tokenmill off", "on/off", "shared tokens served", "vLLM", "vLLM shared served"):
        t.add_column(c)
    for s in result["summary"]:
        if "prefix_off" in s:
            t.add_row(s["dtype"], _f(s["tokenmill"]), _f(s["prefix_off"]), _f(s["prefix_speedup"], ".2f"),
                      f"{s['prefix_hit_tokens']:.0f} / {s['shared_tokens']} ({s['shared_served']:.0%})",
                      _f(s.get("vllm")), _f(s.get("vllm_shared_served"), ".0%"))
    con.print(t)
    for s in result["summary"]:
        if "hf" in s:
            con.print(f"{s['workload']}, {s['dtype']}: tokenmill {s['tokenmill']:.1f} vs HF generate "
                      f"{s['hf']:.1f} out tok/s = {s['ratio_hf']:.1f}x   ({head})")
    con.print(f"load average before {result['load_before']}, after {result['load_after']}")
