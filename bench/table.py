"""Render bench records as the markdown tables BENCHMARKS.md and docs/benchmarks/ take, so
their tables are generated from what a script measured rather than typed.

Every script in ``bench/`` appends its results to ``runs/bench/results.jsonl`` (``--record``,
``bench/common.py``): one JSON line per table with the command, the commit, the machine
header (load average before and after) and the rows. This prints them: the command and
commit, the machine, then the table and its notes.

    python bench/table.py                                   # the newest table of every bench
    python bench/table.py --bench model_step                # the newest of one bench
    python bench/table.py --bench privacy --table dp --all  # every dp table, oldest first
    python bench/table.py /tmp/other-results.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common import RECORDS, header_line, read_records


def format_value(value: Any, spec: str | None = None) -> str:
    """A cell: the script's format spec when it gave one, else thousands separators for
    integers and three significant digits (at least) for floats; None is a dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(format_value(v, spec) for v in value)
    if spec and isinstance(value, (int, float)):
        return format(value, spec)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        size = abs(value)
        spec = ",.0f" if size >= 100 else ".1f" if size >= 10 else ".2f" if size >= 1 else ".3g"
        return format(value, spec)
    return str(value).replace("|", "\\|")


def _numeric(values: list[Any]) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                 for v in present)


def render(record: dict[str, Any]) -> str:
    """One record as markdown: command and provenance, machine, table, notes."""
    rows = record["rows"]
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    formats = record.get("formats", {})
    commit = record.get("commit")
    title = f"`{record['command']}` — {record.get('finished', '')}, " + (
        "commit unknown (not run in a git checkout)" if commit is None else
        f"commit {commit[:12]}" + (" (uncommitted changes)" if commit.endswith("+dirty") else ""))
    name = record["bench"] + ("" if record["table"] == "main" else f" / {record['table']}")
    lines = [f"**{name}**: {title}", "", header_line(record["machine"]), ""]
    if columns:
        lines.append("| " + " | ".join(columns) + " |")
        lines.append("|" + "|".join("---:" if _numeric([r.get(c) for r in rows]) else "---"
                                    for c in columns) + "|")
        for row in rows:
            lines.append("| " + " | ".join(format_value(row.get(c), formats.get(c))
                                           for c in columns) + " |")
    else:
        lines.append("(no rows)")
    if record.get("notes"):
        lines += [""] + [f"- {n.strip()}" for n in record["notes"]]
    return "\n".join(lines) + "\n"


def select(records: list[dict[str, Any]], bench: str | None = None, table: str | None = None,
           every: bool = False) -> list[dict[str, Any]]:
    """The records to show: those of ``bench`` / ``table`` (all when None); with ``every``
    each of them, else the newest of each (bench, table)."""
    chosen = [r for r in records if (bench is None or r["bench"] == bench)
              and (table is None or r["table"] == table)]
    if every:
        return chosen
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in chosen:
        newest[(r["bench"], r["table"])] = r
    return list(newest.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="?", default=RECORDS,
                    help="results file (default: runs/bench/results.jsonl)")
    ap.add_argument("--bench", help="only this bench (the script's name: model_step, ...)")
    ap.add_argument("--table", help="only this table of it (e.g. privacy's dp)")
    ap.add_argument("--all", dest="every", action="store_true",
                    help="every matching record, oldest first (default: the newest of each)")
    args = ap.parse_args(argv)
    if not args.results.is_file():
        print(f"error: no results file at {args.results}: run a bench script first "
              "(each appends its record there) or pass the file", file=sys.stderr)
        return 2
    try:
        records = select(read_records(args.results), args.bench, args.table, args.every)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not records:
        known = sorted({(r["bench"], r["table"]) for r in read_records(args.results)})
        print(f"error: no record of bench {args.bench or 'any'}, table {args.table or 'any'} "
              f"in {args.results}; it holds: "
              + (", ".join(f"{b}/{t}" for b, t in known) or "nothing"), file=sys.stderr)
        return 2
    print("\n".join(render(r) for r in records), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
