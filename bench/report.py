"""Print every bench/results/*.json (or the files given) as Markdown tables: the ratios first, then each
run's command, the facts it read (CPUs, 1-minute load average at the start and the end, Python, torch,
ray and PostgreSQL versions, git commit, dates) and its tables. The report states those facts and
nothing else about the machine.

    .venv/bin/python bench/report.py [bench/results/scale.json ...]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent


def cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {cell(v)}" for k, v in value.items())
    return "-" if value is None else str(value).replace("|", "\\|")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table, a column per key; numbers right-aligned, a `ratio` column with an x."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    numeric = {c for c in columns if all(type(row.get(c)) in (int, float, type(None)) for row in rows)}
    lines = [
        "| " + " | ".join(column.replace("_", " ") for column in columns) + " |",
        "|" + "|".join("---:" if column in numeric else "---" for column in columns) + "|",
    ]
    for row in rows:
        cells = [cell(row.get(c)) + ("x" if c == "ratio" and row.get(c) is not None else "") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def facts_line(run: dict[str, Any]) -> str:
    facts, quiet_load = run["facts"], run["config"]["quiet_load"]
    postgres = str(facts.get("postgresql") or "PostgreSQL version not read").split(",")[0]
    commit, dirty, _ = facts["git"].partition("+dirty")
    return (
        f"{facts['cpus']} CPUs ({facts['platform']}); 1-minute load average {facts['load_1m_start']:.2f} at the "
        f"start (after {facts['quiet_wait_s']} s waiting for < {quiet_load:g}), {facts['load_1m_end']:.2f} at "
        f"the end; Python {facts['python']}, torch {facts['torch']}, ray {facts['ray']}, {postgres}; "
        f"git `{commit[:12]}`{' plus uncommitted changes' if dirty else ''}; "
        f"{facts['started_at']} to {facts['finished_at']}."
    )


def render(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "No results: run a script of bench/ first."
    lines = [
        *table(
            [
                {"benchmark": r["benchmark"], **ratio, "started at": r["facts"]["started_at"]}
                | ({} if r["valid"] else {"figure": f"INVALID RUN: {ratio['figure']}"})
                for r in runs
                for ratio in r["ratios"]
            ]
        ),
    ]
    for r in runs:
        lines += ["", f"### {r['benchmark']}", "", f"`{r['command']}`", "", facts_line(r)]
        if not r["valid"]:
            lines += ["", "**This run is invalid** (requests failed, or points or rows were lost): see its tables."]
        for title, rows in r["tables"].items():
            lines += ["", f"{title}:", "", *table(rows)]
    return "\n".join(lines)


def main() -> None:
    if any(arg.startswith("-") for arg in sys.argv[1:]):
        print(__doc__)
        return
    paths = [Path(arg) for arg in sys.argv[1:]] or sorted((BENCH / "results").glob("*.json"))
    print(render([json.loads(path.read_text()) for path in paths]))


if __name__ == "__main__":
    main()
