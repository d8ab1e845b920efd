"""Labelled tasks for fine-tuning: the common types, and the user's own tasks from files.

A task is train examples, one or more evaluation splits, and a spec (classification or
regression, single text or pair, label names, metrics). GLUE tasks (eval/glue.py) and the
user's own tasks (here) produce the same `TaskData`, so one fine-tuning protocol and one
report serve both.

A custom task comes from TSV, CSV or JSONL files plus a column mapping, given as YAML or as
``key=value,key=value`` on the command line (the same keys)::

    name: reviews            # shown in reports
    train: data/train.csv    # relative paths are relative to the YAML file
    dev: data/dev.csv
    text: review             # column name (or 0-based index when header: false)
    text_pair: null          # second text column for pair tasks
    label: stars
    problem: classification  # or regression
    labels: [neg, pos]       # optional: label order (default: sorted labels seen in train)
    metrics: [accuracy, macro_f1]   # optional (defaults per problem)
    format: auto             # auto (by extension) | tsv | csv | jsonl
    header: true             # tsv/csv: first row names the columns

Every row error names the file and line: a missing column, an empty text, a label not in the
label set, a regression label that is not a number.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shoestring.errors import ShoestringError
from shoestring.fsutil import read_yaml
from shoestring.eval.metrics import METRICS

Problem = Literal["classification", "regression"]

# Some GLUE and user files hold very long fields (whole paragraphs): lift csv's 128 KiB cap.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

__all__ = ["CustomTask", "Example", "TaskData", "TaskSpec", "load_custom_task",
           "parse_task_arg", "read_columns", "read_table",
           "read_utf8"]


@dataclass(frozen=True)
class Example:
    """One labelled example: text ``a`` (and ``b`` for pairs), the raw label, and where it
    came from (``file:line``) so errors found later can still point at it."""

    a: str
    b: str | None
    label: str | float
    where: str


@dataclass
class TaskSpec:
    name: str
    problem: Problem
    pair: bool
    labels: list[str] | None  # classification: label of logit i; None for regression
    metrics: list[str]

    @property
    def num_labels(self) -> int:
        return 1 if self.problem == "regression" else len(self.labels or [])


@dataclass
class TaskData:
    spec: TaskSpec
    train: list[Example]
    evals: dict[str, list[Example]]  # split name → examples ("dev", or MNLI's two)
    source: str
    skipped: dict[str, int] = field(default_factory=dict)  # split → malformed rows skipped

    def facts(self) -> dict[str, Any]:
        """What a result depends on in the task's own data (recorded with each result, and
        compared by ``eval --resume`` before it keeps one)."""
        return {"source": self.source, "train_examples": len(self.train),
                "eval_examples": {s: len(ex) for s, ex in self.evals.items()},
                "skipped_malformed_rows": self.skipped}

    def label_ids(self, examples: list[Example]) -> list[int] | list[float]:
        """Labels as logit indices (classification) or floats (regression)."""
        if self.spec.problem == "regression":
            return [float(e.label) for e in examples]
        index = {lab: i for i, lab in enumerate(self.spec.labels or [])}
        out = []
        for e in examples:
            if e.label not in index:
                raise ShoestringError(
                    f"label {e.label!r} is not one of the task's labels {self.spec.labels}",
                    where=e.where,
                    fix="fix the row, or list every label under `labels:` in the task spec",
                )
            out.append(index[e.label])
        return out


# ---------------------------------------------------------------------------------------------
# Reading tables


def read_utf8(path: Path) -> str:
    """The text of a UTF-8 file (a leading byte-order mark dropped); a missing file or bad
    bytes are a `ShoestringError` naming the path."""
    if not path.is_file():
        raise ShoestringError("file not found", where=str(path), fix="check the path")
    try:
        # utf-8-sig drops a leading byte-order mark (MRPC's header starts with one).
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ShoestringError(
            f"not UTF-8 text (byte {e.start}: {e.reason})",
            where=str(path),
            fix="re-save the file as UTF-8",
        ) from None


def read_table(path: Path, fmt: str) -> list[tuple[int, list[str]]]:
    """Rows of a TSV/CSV file as ``(line_number, fields)``, blank lines skipped.

    TSV is read without quote processing (``csv.QUOTE_NONE``): GLUE's TSVs contain unpaired
    double quotes that a quote-aware reader would swallow whole lines with. CSV uses standard
    RFC 4180 quoting. Line numbers are 1-based physical lines (a quoted CSV field may span
    several; the row's first line is reported).
    """
    text = read_utf8(path)
    if fmt == "tsv":
        reader = csv.reader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE)
        rows = [(i + 1, r) for i, r in enumerate(reader)]
    elif fmt == "csv":
        reader = csv.reader(text.splitlines(keepends=True))
        rows = []
        try:
            for r in reader:
                # reader.line_num is the last physical line consumed by this row.
                rows.append((reader.line_num - sum(f.count("\n") for f in r), r))
        except csv.Error as e:
            raise ShoestringError(f"malformed CSV ({e})", where=f"{path}:{reader.line_num}") from None
    else:
        raise ValueError(f"read_table reads tsv/csv, not {fmt}")
    return [(n, r) for n, r in rows if any(f.strip() for f in r)]


_FORMATS = {".tsv": "tsv", ".tab": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
            ".json": "jsonl"}


def _format_of(path: Path, fmt: str) -> str:
    suffix = path.suffix.lower()
    if fmt == "auto" and suffix not in _FORMATS:
        raise ShoestringError(
            f"cannot tell the file format from the extension {suffix!r}",
            where=str(path),
            fix="use .tsv, .csv or .jsonl, or set format: tsv|csv|jsonl in the task spec",
        )
    return _FORMATS[suffix] if fmt == "auto" else fmt


# ---------------------------------------------------------------------------------------------
# Custom tasks


class CustomTask(BaseModel):
    """A user's labelled task: files and the column mapping (see module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("custom", min_length=1)
    train: str
    dev: str
    text: str | int
    text_pair: str | int | None = None
    label: str | int
    problem: Problem = "classification"
    labels: list[str] | None = None
    metrics: list[str] | None = None
    format: Literal["auto", "tsv", "csv", "jsonl"] = "auto"
    header: bool = True

    @model_validator(mode="after")
    def _check(self) -> CustomTask:
        for m in self.metrics or []:
            if m not in METRICS:
                raise ValueError(f"unknown metric {m!r}; known: {', '.join(sorted(METRICS))}")
        if self.problem == "regression" and self.labels:
            raise ValueError("labels: only applies to classification tasks")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ValueError("labels: contains duplicates")
        if self.labels is not None and len(self.labels) < 2:
            raise ValueError("labels: a classification task needs at least two labels")
        return self


def _validate(tree: dict[str, Any], source: str) -> CustomTask:
    try:
        return CustomTask.model_validate(tree)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "task"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown key; allowed keys: {', '.join(CustomTask.model_fields)}"
            lines.append(f"{loc}: {msg}")
        raise ShoestringError(
            "invalid task spec:\n  " + "\n  ".join(lines),
            where=source,
            fix="see docs/eval.md (custom tasks) for the keys",
        ) from None


def parse_task_arg(arg: str) -> CustomTask:
    """``--task`` value: a YAML file, or ``key=value,key=value`` with the same keys."""
    p = Path(arg)
    if p.suffix.lower() in (".yaml", ".yml") or (p.is_file() and "=" not in arg):
        tree = read_yaml(p, "task spec file") or {}
        if not isinstance(tree, dict):
            raise ShoestringError("a task spec must be a mapping of keys to values", where=arg)
        spec = _validate(tree, arg)
        # Relative paths are relative to the YAML file (an absolute one replaces the base).
        return spec.model_copy(update={k: str(p.parent / Path(getattr(spec, k)).expanduser())
                                       for k in ("train", "dev")})
    tree: dict[str, Any] = {}
    for part in arg.split(","):
        if "=" not in part:
            raise ShoestringError(
                f"task item {part!r} has no '='",
                where="--task",
                fix="give a YAML file, or key=value pairs: train=t.csv,dev=d.csv,text=review,label=y",
            )
        key, value = part.split("=", 1)
        key, value = key.strip(), value.strip()
        if key == "labels" or key == "metrics":
            tree[key] = [v for v in value.split("|") if v]
        elif key == "header":
            tree[key] = value.lower() in ("1", "true", "yes")
        elif key in ("text", "text_pair", "label") and value.isdigit():
            tree[key] = int(value)
        else:
            tree[key] = value if value.lower() not in ("null", "none", "") else None
    return _validate(tree, "--task")


def read_columns(
    path: Path, fmt: str, header: bool, cols: tuple[str | int | None, ...], empty_fix: str,
    column_fix: str,
) -> tuple[list[tuple[int, list[str]]], list[int | None], list[str] | None]:
    """(data rows, the index of each of ``cols``, the header's names or None) of a TSV/CSV
    table: custom tasks and GLUE read their files alike. A column is a name in the header or
    a 0-based index (None stays None); ``empty_fix``/``column_fix`` say what to do about a
    file without examples or a column the header lacks."""
    rows = read_table(path, fmt)
    if not rows or (header and len(rows) == 1):
        raise ShoestringError(
            "the file has no examples" + (" (only a header)" if rows else " (it is empty)"),
            where=str(path),
            fix=empty_fix,
        )
    names = None
    if header:
        (hline, names), rows = rows[0], rows[1:]
        names = [h.strip() for h in names]
    else:
        hline = rows[0][0]
    return rows, [_column_index(names, c, f"{path}:{hline}", column_fix) for c in cols], names


def _column_index(names: list[str] | None, col: str | int | None, where: str,
                  fix: str) -> int | None:
    if col is None or isinstance(col, int):
        return col
    if names is None:
        raise ShoestringError(
            f"column {col!r} is named but the file has no header (header: false)",
            where=where,
            fix="give the column as a 0-based index, or set header: true",
        )
    if col not in names:
        raise ShoestringError(
            f"column {col!r} not found; the header has: {', '.join(repr(n) for n in names)}",
            where=where,
            fix=fix,
        )
    return names.index(col)


def _read_examples(task: CustomTask, path: Path) -> list[Example]:
    fmt = _format_of(path, task.format)
    if fmt == "jsonl":
        return _read_jsonl(task, path)
    rows, (ia, ib, il), _ = read_columns(
        path, fmt, task.header, (task.text, task.text_pair, task.label),
        empty_fix="point the task at a file with labelled rows",
        column_fix="fix the column mapping (text=, text_pair=, label=)",
    )
    need = max(i for i in (ia, ib, il) if i is not None) + 1
    out = []
    for line, r in rows:
        where = f"{path}:{line}"
        if len(r) < need:
            raise ShoestringError(
                f"row has {len(r)} field(s), the column mapping needs {need}",
                where=where,
                fix="fix the row (a stray delimiter or quote?) or the column mapping",
            )
        out.append(_example(task, r[ia], None if ib is None else r[ib], r[il], where))
    return out


def iter_json_objects(text: str, path: Path) -> Iterator[tuple[str, dict]]:
    """(``file:line``, object) for each non-blank JSON-lines row; bad rows name their line."""
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ShoestringError(f"not valid JSON ({e.msg}, column {e.colno})", where=where) from None
        if not isinstance(obj, dict):
            raise ShoestringError("each line must be a JSON object", where=where)
        yield where, obj


def _read_jsonl(task: CustomTask, path: Path) -> list[Example]:
    out = []
    for where, obj in iter_json_objects(read_utf8(path), path):
        keys = (task.text, task.text_pair, task.label)
        for key in keys:
            if key is not None and str(key) not in obj:
                raise ShoestringError(
                    f"field {str(key)!r} missing; this record has: {', '.join(map(repr, obj))}",
                    where=where,
                    fix="fix the record or the column mapping (text=, text_pair=, label=)",
                )
        a, b, lab = (None if key is None else obj[str(key)] for key in keys)
        if not isinstance(a, str) or (b is not None and not isinstance(b, str)):
            raise ShoestringError("text fields must be JSON strings", where=where)
        out.append(_example(task, a, b, lab, where))
    if not out:
        raise ShoestringError("the file has no examples (it is empty)", where=str(path))
    return out


def _example(task: CustomTask, a: str, b: str | None, label: Any, where: str) -> Example:
    if not str(a).strip():
        raise ShoestringError("empty text", where=where, fix="fill in or drop the row")
    if task.problem == "regression":
        try:
            value: str | float = float(label)
        except (TypeError, ValueError):
            raise ShoestringError(
                f"regression label {label!r} is not a number", where=where, fix="fix the row"
            ) from None
        if math.isnan(value):
            raise ShoestringError("regression label is NaN", where=where, fix="fix the row")
    else:
        if label is None or (isinstance(label, str) and not label.strip()):
            raise ShoestringError("empty label", where=where, fix="fill in or drop the row")
        value = str(label).strip() if not isinstance(label, bool) else str(label).lower()
    return Example(a, b, value, where)


def load_custom_task(task: CustomTask) -> TaskData:
    """Read and check a custom task's train and dev files."""
    train = _read_examples(task, Path(task.train))
    dev = _read_examples(task, Path(task.dev))
    if task.problem == "regression":
        labels = None
        metrics = task.metrics or ["pearson", "spearman"]
    else:
        labels = task.labels or sorted({str(e.label) for e in train}, key=_natural)
        if len(labels) < 2:
            raise ShoestringError(
                f"the training file has only one label ({labels[0]!r}): nothing to learn",
                where=task.train,
                fix="check the label column",
            )
        metrics = task.metrics or (["accuracy", "f1"] if len(labels) == 2 else ["accuracy", "macro_f1"])
    spec = TaskSpec(task.name, task.problem, task.text_pair is not None, labels, metrics)
    data = TaskData(spec, train, {"dev": dev}, source=f"{task.train} + {task.dev}")
    data.label_ids(train)  # unknown labels fail here, with file:line, before any training
    data.label_ids(dev)
    return data


def _natural(label: str) -> tuple:
    """Numeric labels in numeric order (0, 1, 2, 10), others alphabetically."""
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)
