"""Rich table of a planner comparison (``dl-nfv plan compare``)."""

from __future__ import annotations

from rich.table import Table

GIB = 2**30


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render_rows(data: dict) -> Table:
    table = Table(title=f"{data['graph']} on {data['topology']}", title_justify="left")
    for col in ("planner", "stages", "microbatches", "iteration ms", "vs dp", "/ bound",
                "peak mem GiB", "plan s", "note"):
        table.add_column(col, justify="left" if col in ("planner", "note") else "right")
    for r in data["rows"]:
        if not r["feasible"]:
            table.add_row(r["planner"], "", "", "", "", "", "", "", f"infeasible: {r.get('error', '')}")
            continue
        peak = r.get("peak_memory_bytes")
        table.add_row(r["planner"], _num(r.get("stages"), "d"), _num(r.get("microbatches"), "d"),
                      _num(r.get("iteration_ms"), ".2f"), _num(r.get("speedup_vs_dp"), ".2f") + "x"
                      if r.get("speedup_vs_dp") else "-", _num(r.get("ratio_to_bound"), ".2f"),
                      _num(peak / GIB if peak is not None else None, ".2f"),
                      _num(r.get("plan_s"), ".2f"), "")
    return table
