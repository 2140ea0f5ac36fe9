"""The tables and the two ratio lines of bench/w_kr.py (not part of Reel)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from _bench_common import console
from rich.table import Table

if TYPE_CHECKING:
    from w_kr import Bench

LABELS = {
    "raw": "raw JetStream acked publish",
    "tool": "Reel, recorded tool steps",
    "model": "Reel, scripted model steps",
    "agent": "Reel, agent turn with one python tool call",
    "raw_always": "raw acked publish, sync_interval: always",
    "tool_always": "Reel, tool steps, sync_interval: always",
    "langgraph": "LangGraph, SqliteSaver, durability sync",
    "restate": "Restate",
}
ROLES = ("executor", "verifier", "nats-server", "driver")
SHORT = {"REEL_EVENTS": "events", "OBJ_reel_blobs": "blobs", "KV_reel_outcomes": "markers", "REEL_CMDS": "commands",
         "KV_reel_snapshots": "snapshots", "KV_reel_leases": "leases", "REEL_VERDICTS": "verdicts",
         "verifier deliveries": "verifier deliveries"}


def _med(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def _fmt(x: float, nd: int = 0) -> str:
    return "—" if math.isnan(x) else f"{x:,.{nd}f}"


def _spread(xs: list[float]) -> str:
    xs = [x for x in xs if not math.isnan(x)]
    return f"{_fmt(_med(xs))} [{_fmt(min(xs))}–{_fmt(max(xs))}]" if xs else "—"


def _per_key(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for r in rows for k in r}
    return {k: _med([r.get(k, 0.0) for r in rows]) for k in sorted(keys)}


def print_report(bench: Bench, long: dict[str, float] | None, scaled: list[dict[str, float]], *, load0: str,
                 load1: str, elapsed_s: float, ratio: Callable[..., float], peers: bool) -> dict[str, Any]:
    """Print the tables and the ratio lines (last); return every figure for ``--json``."""
    labels = {**LABELS, **{f"{v}@base": f"{label} (baseline code)" for v, label in LABELS.items()}}
    raw_of = {v: ("raw_always" if v.split("@")[0].endswith("always") else "raw") for v in labels}
    t = Table(title=f"W(K, R): {len(bench.a['raw'])} rounds, medians [min–max]", title_justify="left")
    for col in ("engine", "(a) W(200,1) µs/step", "(a) wall µs/step", "× raw", "(b) W(20,50) steps/s"):
        t.add_column(col, justify="left" if col == "engine" else "right")
    for v, label in ((w, labels[w]) for v0 in LABELS for w in (v0, f"{v0}@base")):
        if not bench.a.get(v):
            continue
        t.add_row(label, _spread([s.a_median_us for s in bench.a[v]]), _fmt(_med([s.a_wall_us for s in bench.a[v]])),
                  _fmt(ratio(bench, v, raw_of[v]), 2), _spread([s.b_steps_per_s for s in bench.b[v]]))
    console.print(t)

    cpu = Table(title="CPU µs per step, by process (median over rounds)", title_justify="left")
    for col in ("variant", *ROLES, "total"):
        cpu.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    cpu_out = {}
    for key in sorted(bench.cpu):
        per = _per_key(bench.cpu[key])
        cpu_out[key] = per
        cpu.add_row(key, *(_fmt(per.get(r, float("nan"))) for r in ROLES), _fmt(sum(per.get(r, 0.0) for r in ROLES)))
    console.print(cpu)

    msgs = Table(title="messages stored per step, by stream (median over rounds)", title_justify="left")
    msgs_out = {key: {SHORT.get(s, s): v for s, v in _per_key(rows).items()}
                for key, rows in sorted(bench.msgs.items())}
    streams = sorted({s for per in msgs_out.values() for s in per})
    for col in ("variant", *streams, "stored total"):
        msgs.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    for key, per in msgs_out.items():
        total = sum(v for s, v in per.items() if s != "verifier deliveries")
        msgs.add_row(key, *(_fmt(per.get(s, 0.0), 2) for s in streams), _fmt(total, 2))
    console.print(msgs)

    if long:
        lt = Table(title=f"one {long['steps']:,}-step tool run: first vs last {long['window']:,} steps",
                   title_justify="left")
        for col in ("", "first µs/step", "last µs/step", "last ÷ first"):
            lt.add_column(col, justify="right")
        lt.add_row("mean (window wall ÷ steps)", _fmt(long["first_mean_us"]), _fmt(long["last_mean_us"]),
                   _fmt(long["last_mean_us"] / long["first_mean_us"], 2))
        lt.add_row("median interval", _fmt(long["first_median_us"]), _fmt(long["last_median_us"]),
                   _fmt(long["last_median_us"] / long["first_median_us"], 2))
        console.print(lt)
        console.print(f"long run wall/step {_fmt(long['wall_us_per_step'])} µs")
    if scaled:
        st = Table(title=f"{scaled[0]['runs']:.0f} runs × 3 tool steps started at once, by executor processes "
                         f"(median of {scaled[0]['rounds']:.0f} rounds)",
                   title_justify="left")
        for col in ("code", "executors", "end-to-end s", "steps/s", "CPU µs/step, all", "executors", "verifier",
                    "nats-server", "driver", "CPU ÷ 1 executor"):
            st.add_column(col, justify="right")
        first = {row["code"]: row for row in reversed(scaled)}  # each code's 1-executor row (the first count)
        for row in scaled:
            st.add_row(str(row["code"]), f"{row['executors']:.0f}", _fmt(row["wall_s"], 2), _fmt(row["steps_per_s"]),
                       _fmt(row["cpu_us_per_step"]), _fmt(row["executors_cpu_us_per_step"]),
                       _fmt(row["verifier_cpu_us_per_step"]), _fmt(row["server_cpu_us_per_step"]),
                       _fmt(row["driver_cpu_us_per_step"]),
                       _fmt(row["cpu_us_per_step"] / first[row["code"]]["cpu_us_per_step"], 2))
        console.print(st)
    for f in bench.failures:
        console.print(f"[red]peer failed:[/] {f}")
    console.print(f"before: {load0}\nafter:  {load1}\nelapsed {elapsed_s:.0f} s")

    if bench.a.get("tool@base") or bench.a.get("model@base"):
        print(f"baseline ratio tool_vs_raw={ratio(bench, 'tool@base', 'raw'):.2f} "
              f"model_vs_raw={ratio(bench, 'model@base', 'raw'):.2f} "
              f"tool_vs_baseline={ratio(bench, 'tool', 'tool@base'):.2f} "
              f"throughput_vs_baseline={ratio(bench, 'tool', 'tool@base', 'b'):.2f}")
    ratios = {"tool_vs_raw": ratio(bench, "tool", "raw"), "model_vs_raw": ratio(bench, "model", "raw")}
    print(f"ratio tool_vs_raw={ratios['tool_vs_raw']:.2f} model_vs_raw={ratios['model_vs_raw']:.2f}")
    if peers:
        ratios |= {"tool_vs_langgraph": ratio(bench, "tool", "langgraph"),
                   "model_vs_langgraph": ratio(bench, "model", "langgraph"),
                   "throughput_vs_restate": ratio(bench, "tool", "restate", "b"),
                   "fsync_tool_vs_langgraph": ratio(bench, "tool_always", "langgraph")}
        print("ratio " + " ".join(f"{k}={ratios[k]:.2f}" for k in ("tool_vs_langgraph", "model_vs_langgraph",
                                                                   "throughput_vs_restate",
                                                                   "fsync_tool_vs_langgraph")))
    return {"a": {v: [s.__dict__ for s in xs] for v, xs in bench.a.items()},
            "b": {v: [s.__dict__ for s in xs] for v, xs in bench.b.items()},
            "cpu_us_per_step": cpu_out, "msgs_per_step": msgs_out, "long": long, "scale": scaled, "ratios": ratios,
            "load_before": load0, "load_after": load1, "elapsed_s": elapsed_s, "failures": bench.failures}
