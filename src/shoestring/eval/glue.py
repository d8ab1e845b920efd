"""The GLUE benchmark: the task registry and readers for the official file layout.

The directory layout is the one the official download script (``download_glue_data.py``)
writes, one folder per task:

=========  =================================  ======  ==========================================
task       files                              header  columns used (text a, text b, label)
=========  =================================  ======  ==========================================
CoLA       train.tsv dev.tsv                  no      3 (sentence), -, 1
SST-2      train.tsv dev.tsv                  yes     sentence, -, label
MRPC       train.tsv dev.tsv                  yes*    #1 String, #2 String, Quality
STS-B      train.tsv dev.tsv                  yes     sentence1, sentence2, score (last column)
QQP        train.tsv dev.tsv                  yes     question1, question2, is_duplicate
MNLI       train.tsv dev_matched.tsv          yes     sentence1, sentence2, gold_label (last)
           dev_mismatched.tsv
QNLI       train.tsv dev.tsv                  yes     question, sentence, label
RTE        train.tsv dev.tsv                  yes     sentence1, sentence2, label
WNLI       train.tsv dev.tsv                  yes     sentence1, sentence2, label
=========  =================================  ======  ==========================================

(*) MRPC's header starts with a UTF-8 byte-order mark. The files are read without quote
processing: MRPC and MNLI contain unpaired double quotes. MNLI's train file has 12 columns
and its dev files 16 (five annotator labels), so the label is taken as the *last* field; the
same holds for STS-B's score. QQP has a few malformed rows (questions with embedded line
breaks); they are skipped and counted, as the reference implementations do — in every other
task a malformed row is an error naming its line.

Alternatively the tasks load from the Hugging Face ``glue`` dataset (``--glue hf``), which
needs a network. The test splits are never read: GLUE's test labels are private.

Metrics follow GLUE: Matthews correlation (CoLA), accuracy, F1 and accuracy (MRPC, QQP),
Pearson and Spearman (STS-B); a task's score is the mean of its metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from pathlib import Path

from shoestring.errors import ShoestringError
from shoestring.eval.tasks import Example, Problem, TaskData, TaskSpec, read_columns

__all__ = ["GLUE_TASKS", "SCORE_COLUMNS", "GlueTask", "from_hf_dataset", "load_glue_task",
           "parse_task_list"]


@dataclass(frozen=True)
class GlueTask:
    name: str  # our key: cola, sst2, ...
    folder: str  # official folder name
    hf_name: str  # Hugging Face `glue` config
    problem: Problem
    labels: tuple[str, ...] | None  # logit order (Hugging Face's, so label ids agree)
    metrics: tuple[str, ...]
    header: bool
    a: str | int
    b: str | int | None
    label: str | int
    label_last: bool = False  # label is the last field whatever the row's width
    evals: tuple[tuple[str, str], ...] = (("dev", "dev.tsv"),)  # (split name, file)
    skip_malformed: bool = False
    hf_fields: tuple[str, str | None] = ("sentence", None)
    hf_evals: tuple[tuple[str, str], ...] = (("dev", "validation"),)

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(self.name, self.problem, self.b is not None,
                        list(self.labels) if self.labels else None, list(self.metrics))


_B = ("0", "1")
_ENT = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in [
    GlueTask("cola", "CoLA", "cola", "classification", _B, ("mcc",), False, 3, None, 1),
    GlueTask("sst2", "SST-2", "sst2", "classification", _B, ("accuracy",), True,
             "sentence", None, "label"),
    GlueTask("mrpc", "MRPC", "mrpc", "classification", _B, ("f1", "accuracy"), True,
             "#1 String", "#2 String", "Quality", hf_fields=("sentence1", "sentence2")),
    GlueTask("stsb", "STS-B", "stsb", "regression", None, ("pearson", "spearman"), True,
             "sentence1", "sentence2", "score", label_last=True,
             hf_fields=("sentence1", "sentence2")),
    GlueTask("qqp", "QQP", "qqp", "classification", _B, ("f1", "accuracy"), True,
             "question1", "question2", "is_duplicate", skip_malformed=True,
             hf_fields=("question1", "question2")),
    GlueTask("mnli", "MNLI", "mnli", "classification", ("entailment", "neutral", "contradiction"),
             ("accuracy",), True, "sentence1", "sentence2", "gold_label", label_last=True,
             evals=(("dev_matched", "dev_matched.tsv"), ("dev_mismatched", "dev_mismatched.tsv")),
             hf_fields=("premise", "hypothesis"),
             hf_evals=(("dev_matched", "validation_matched"),
                       ("dev_mismatched", "validation_mismatched"))),
    GlueTask("qnli", "QNLI", "qnli", "classification", _ENT, ("accuracy",), True,
             "question", "sentence", "label", hf_fields=("question", "sentence")),
    GlueTask("rte", "RTE", "rte", "classification", _ENT, ("accuracy",), True,
             "sentence1", "sentence2", "label", hf_fields=("sentence1", "sentence2")),
    GlueTask("wnli", "WNLI", "wnli", "classification", _B, ("accuracy",), True,
             "sentence1", "sentence2", "label", hf_fields=("sentence1", "sentence2")),
]}

# The numbers a GLUE table shows, in the usual column order: (column, task, eval split). A
# column is named by the task's folder; MNLI's two dev sets are MNLI-m and MNLI-mm.
_MNLI_COLUMNS = {"dev_matched": "MNLI-m", "dev_mismatched": "MNLI-mm"}
SCORE_COLUMNS: list[tuple[str, str, str]] = [
    (_MNLI_COLUMNS.get(split, GLUE_TASKS[t].folder), t, split)
    for t in ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte", "wnli")
    for split, _ in GLUE_TASKS[t].evals
]

_ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli-mm": "mnli"}


def parse_task_list(text: str) -> list[str]:
    """``"cola,sst2,mrpc"`` (or ``all``, or ``glue`` = all but WNLI) → task keys, in order."""
    names: list[str] = []
    for raw in text.split(","):
        key = raw.strip().lower()
        if not key:
            continue
        if key == "all":
            names += list(GLUE_TASKS)
            continue
        if key == "glue":
            names += [k for k in GLUE_TASKS if k != "wnli"]
            continue
        key = _ALIASES.get(key, key)
        if key not in GLUE_TASKS:
            raise ShoestringError(
                f"unknown GLUE task {raw.strip()!r}",
                where="--tasks",
                fix=f"choose from {', '.join(GLUE_TASKS)} (or all, or glue = all but WNLI)",
            )
        names.append(key)
    return list(dict.fromkeys(names))


def _task_dir(root: Path, task: GlueTask) -> Path:
    for name in (task.folder, task.folder.lower(), task.name, task.folder.replace("-", "")):
        if (root / name).is_dir():
            return root / name
    raise ShoestringError(
        f"no {task.folder}/ folder for task {task.name}",
        where=str(root),
        fix=f"download GLUE in the official layout ({task.folder}/train.tsv, ...), "
        "or leave the task out of --tasks",
    )


def _read_split(task: GlueTask, path: Path, max_rows: int | None) -> tuple[list[Example], int]:
    rows, (ia, ib, il), header = read_columns(
        path, "tsv", task.header, (task.a, task.b, task.label),
        empty_fix="re-download the task (official GLUE layout)",
        column_fix="is this the official GLUE file for this task?",
    )
    need = max(i for i in (ia, ib, il) if i is not None) + 1
    if header is not None and task.label_last:
        need = max(need, len(header))
    out: list[Example] = []
    skipped = 0
    for line, r in rows:
        where = f"{path}:{line}"
        if len(r) < need:
            if task.skip_malformed:
                skipped += 1
                continue
            raise ShoestringError(
                f"{task.folder}: row has {len(r)} field(s), expected at least {need}",
                where=where,
                fix="the file is damaged; re-download the task (official GLUE layout)",
            )
        label = (r[-1] if task.label_last else r[il]).strip()
        a, b = r[ia], (None if ib is None else r[ib])
        if task.problem == "regression":
            try:
                value: str | float = float(label)
            except ValueError:
                raise ShoestringError(
                    f"{task.folder}: score {label!r} is not a number", where=where
                ) from None
        else:
            if task.labels is not None and label not in task.labels:
                if task.skip_malformed:
                    skipped += 1
                    continue
                raise ShoestringError(
                    f"{task.folder}: unknown label {label!r} (expected one of {list(task.labels)})",
                    where=where,
                    fix="the file is damaged or belongs to another task",
                )
            value = label
        out.append(Example(a, b, value, where))
        if max_rows is not None and len(out) >= max_rows:
            break
    return out, skipped


def load_glue_task(
    root: str | Path, name: str, max_train: int | None = None
) -> TaskData:
    """Read task ``name`` from a GLUE directory, or from Hugging Face when ``root`` is "hf".

    ``max_train`` keeps the first N training rows (a quick look, not the protocol: reports
    flag it).
    """
    task = GLUE_TASKS[name]
    if str(root) == "hf":
        return _load_hf(task, max_train)
    root = Path(root)
    if not root.is_dir():
        raise ShoestringError("GLUE directory not found", where=str(root), fix="check --glue")
    folder = _task_dir(root, task)
    files = (("train", "train.tsv"), *task.evals)
    for split, fname in files:
        if not (folder / fname).is_file():
            raise ShoestringError(
                f"{task.folder} has no {fname} (its {split} set)", where=str(folder),
                fix=f"download the task's files ({', '.join(f for _, f in files)}; official "
                "GLUE layout)",
            )
    train, skipped_train = _read_split(task, folder / "train.tsv", max_train)
    evals, skipped = {}, {"train": skipped_train}
    for split, fname in task.evals:
        evals[split], skipped[split] = _read_split(task, folder / fname, None)
    return TaskData(task.spec, train, evals, source=str(folder),
                    skipped={k: v for k, v in skipped.items() if v})


def _load_hf(task: GlueTask, max_train: int | None) -> TaskData:
    """The same task from the Hugging Face hub's ``glue`` dataset (needs a network)."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        raise ShoestringError("the `datasets` package is not installed", fix="pip install datasets") from None
    try:
        ds = datasets.load_dataset("glue", task.hf_name)
    except Exception as e:  # noqa: BLE001 - network, hub and cache errors alike
        raise ShoestringError(
            f"cannot load glue/{task.hf_name} from Hugging Face ({type(e).__name__}: {e})",
            where="--glue hf",
            fix="check the network, or download GLUE and pass --glue DIR",
        ) from None
    return from_hf_dataset(task, ds, max_train)


def from_hf_dataset(task: GlueTask, ds: Any, max_train: int | None = None) -> TaskData:
    """A task from a `datasets.DatasetDict` laid out like the hub's ``glue`` config.

    Class labels map by name where the hub's ``ClassLabel`` names are ours (MNLI, QNLI, RTE,
    WNLI: "entailment", ...), else by index (CoLA, SST-2, MRPC, QQP: "0"/"1"), so a model
    fine-tuned from the hub and one from the GLUE files share one label order.
    """
    fa, fb = task.hf_fields

    def convert(hf_split: str, limit: int | None) -> list[Example]:
        rows = ds[hf_split]
        names = getattr(rows.features["label"], "names", None)
        out = []
        for i, r in enumerate(rows):
            if limit is not None and i >= limit:
                break
            lab = r["label"]
            if task.problem == "regression":
                value: str | float = float(lab)
            else:
                value = names[lab] if names and task.labels and names[lab] in task.labels else str(lab)
            out.append(Example(r[fa], r[fb] if fb else None, value, f"hf:glue/{task.hf_name}/{hf_split}#{i}"))
        return out

    train = convert("train", max_train)
    evals = {split: convert(hf_split, None) for split, hf_split in task.hf_evals}
    return TaskData(task.spec, train, evals, source=f"hf:glue/{task.hf_name}")
