"""What every script in ``bench/`` shares: the machine header printed above its figures, the
arguments the scripts have in common, and the JSON-lines record the tables of BENCHMARKS.md and
docs/benchmarks/ are rendered from (``bench/table.py``).

A figure means nothing without the machine and the load it was measured under, and a table
typed by hand drifts from what was printed. So each script makes one `Bench`: it prints the
header (CPU, cores, torch threads, precision, torch version, load average) when the
measurement starts, takes the script's result rows, and at the end prints the load average
again and appends one record per table to ``--record`` (default ``runs/bench/results.jsonl``):
the bench's name, its command line, the git commit, the header with the load average before
and after, a timestamp and the rows.

How scripts import this file: they run as ``python bench/<name>.py``, and Python puts the
script's own folder first on ``sys.path`` whatever the working directory, so ``import common``
(like ``import peers`` and ``import jobs``) finds this folder with no ``sys.path`` edit; a
script that re-runs itself as a job (``[sys.executable, __file__, ...]``) gets the same. Code
started with ``python -c`` does not, so scripts hand such children data, not imports. Making
``bench`` a package instead would turn every ``python bench/<name>.py`` command in README.md,
BENCHMARKS.md and docs/ into ``python -m bench.<name>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the checkout
SHARED = ROOT.parent / "shared" / "data"  # shared corpora and GLUE, as tests/conftest.py finds them
RECORDS = ROOT / "runs" / "bench" / "results.jsonl"
SCHEMA = 1  # the record's layout; bump when a field changes meaning
HEADER_FIELDS = ("cpu", "cores", "torch_threads", "precision", "device", "torch", "python",
                 "load_before", "load_after")


# ---------------------------------------------------------------------------- the machine


def load_average() -> list[float] | None:
    """The 1/5/15-minute load average: other work on a small shared machine moves every
    figure, so it is printed beside them (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_load(load: list[float] | None) -> str:
    return "unknown" if load is None else " ".join(f"{x:.2f}" for x in load)


def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo``'s model name; ``platform`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_header(precision: str | None = None, device: str | None = None,
                   threads: int | None = None, **extra: str) -> dict[str, Any]:
    """Where a figure was measured: CPU, cores, torch threads (``threads`` when the measured
    processes run another count than this one), precision, device, versions and the load
    average now (``load_after`` is filled when the bench ends). ``extra``: other versions
    that matter to the figures (e.g. ``transformers``)."""
    try:
        import torch

        torch_version, torch_threads = torch.__version__, torch.get_num_threads()
    except ImportError:
        torch_version, torch_threads = None, None
    return {"cpu": cpu_name(), "cores": os.cpu_count(),
            "torch_threads": threads if threads is not None else torch_threads,
            "precision": precision, "device": device, "torch": torch_version,
            "python": platform.python_version(), **extra,
            "load_before": load_average(), "load_after": None}


def header_line(h: dict[str, Any]) -> str:
    """The header as one line: what every script prints before its figures."""
    versions = ", ".join(f"{k} {h[k]}" for k in h if k not in HEADER_FIELDS and h[k] is not None)
    parts = [f"{h['cpu']} ({h['cores']} cores, {h['torch_threads']} torch threads)",
             f"torch {h['torch']}" + (f", {versions}" if versions else "")]
    if h.get("device"):
        parts.append(f"device {h['device']}")
    if h.get("precision"):
        parts.append(f"precision {h['precision']}")
    load = f"load average {format_load(h['load_before'])}"
    if h.get("load_after") is not None:
        load += f" before, {format_load(h['load_after'])} after"
    return "; ".join([*parts, load])


# ---------------------------------------------------------------------------- provenance


def git_commit() -> str | None:
    """This tree's commit, with ``+dirty`` when tracked files differ from it (None outside a
    git checkout): which code printed a figure."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user types it from the repository root: ``python bench/<name>.py``."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *argv[1:]])


# ---------------------------------------------------------------------------- arguments


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The script's parser: its docstring's first paragraph as the description, and where
    its record goes (``--record``, ``--no-record``)."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--record", type=Path, default=RECORDS,
                    help="JSON-lines file the results are appended to, one line per table "
                    "(default: runs/bench/results.jsonl; bench/table.py renders it)")
    ap.add_argument("--no-record", dest="record", action="store_const", const=None,
                    help="append no record")
    return ap


def wall_budget(text: str) -> Any:
    """argparse ``type=`` for a wall-clock budget (90s, 20m, 1h): its `BudgetSpec`, or the
    usage error (exit 2) naming the forms."""
    from shoestring.units import parse_budget

    try:
        budget = parse_budget(text)
    except Exception as e:  # the budget grammar's own error
        raise argparse.ArgumentTypeError(str(e)) from None
    if budget.kind != "seconds":
        raise argparse.ArgumentTypeError(f"{text!r}: give a wall-clock budget (90s, 20m, 1h)")
    return budget


def add_repeats(ap: argparse.ArgumentParser, default: int,
                help: str = "interleaved rounds; the median is reported") -> None:
    ap.add_argument("--repeats", type=int, default=default, help=help)


# ---------------------------------------------------------------------------- the record


class Bench:
    """One measurement by one script: prints the machine header now, collects the result
    tables, and at `end` prints the load average again and appends the records."""

    def __init__(self, name: str, args: argparse.Namespace | None = None, *,
                 precision: str | None = None, device: str | None = None,
                 threads: int | None = None, file: Any = None, **extra: str) -> None:
        self.name = name
        self.record = getattr(args, "record", None)
        if self.record is not None:
            check_record_path(Path(self.record))
        self.file = file or sys.stdout
        self.started = _now()
        self.header = machine_header(precision, device, threads, **extra)
        self.tables: list[dict[str, Any]] = []
        print(f"machine: {header_line(self.header)}", file=self.file, flush=True)

    def table(self, rows: list[dict[str, Any]], name: str = "main",
              formats: dict[str, str] | None = None, notes: list[str] | None = None) -> None:
        """One table of results: ``rows`` of {column: value}; ``formats``: a format spec per
        column (``",.0f"``) so the rendered table shows the digits the script printed;
        ``notes``: lines printed under it (how each side was configured)."""
        self.tables.append({"table": name, "rows": rows, "formats": formats or {},
                            "notes": notes or []})

    def end(self) -> list[dict[str, Any]]:
        """Print the load average at the end; append one record per table to ``--record``."""
        self.header["load_after"] = load_average()
        print(f"load average at the end: {format_load(self.header['load_after'])}",
              file=self.file, flush=True)
        records = [{"schema": SCHEMA, "bench": self.name, **t, "command": command_line(),
                    "commit": git_commit(), "started": self.started, "finished": _now(),
                    "machine": self.header} for t in self.tables]
        if self.record is not None and records:
            try:
                append_records(Path(self.record), records)
                print(f"recorded {len(records)} table(s) in {self.record}", file=self.file)
            except OSError as e:  # the figures are printed; the script's own outputs still go
                print(f"error: could not append the record to {self.record} ({e.strerror}); "
                      "the figures above are not recorded", file=sys.stderr)
        return records


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def check_record_path(path: Path) -> None:
    """Refuse a ``--record`` that cannot be written before the measurement, not after it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"error: --record {path}: cannot create {path.parent} ({e.strerror}); "
                         "pass another --record PATH or --no-record") from None
    if not os.access(path if path.exists() else path.parent, os.W_OK) or path.is_dir():
        raise SystemExit(f"error: --record {path}: not a writable file; pass another "
                         "--record PATH or --no-record")


def append_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Append records as JSON lines, in one write (a reader never sees half a record
    unless the machine dies mid-write; `read_records` then names the line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, default=str) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record in a results file, oldest first; a line that is not a record is an
    error naming the file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON record ({e.msg}); remove the line "
                                 "(an interrupted write) and rerun") from None
            missing = [k for k in ("bench", "table", "rows", "machine", "command") if k not in rec]
            if missing:
                raise ValueError(f"{path}:{n}: not a bench record (no {', '.join(missing)})")
            out.append(rec)
    return out
