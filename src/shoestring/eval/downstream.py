"""`shoestring eval RUN --glue DIR / --task SPEC`: fine-tune on tasks and write the report.

Everything is read and checked before any training (every task file parsed, every label
known), so a typo in the last task fails in seconds, not after an hour of fine-tuning. The
output folder gets ``results.json`` (rewritten after each task, so a long run shows its
progress and keeps what finished), ``results.md``, ``results.png`` and
``classifiers/TASK/`` (the median seed's classifier, loadable by `serve`).

With ``resume`` (`shoestring eval --resume`), the tasks an interrupted evaluation already
finished are kept, not fine-tuned again, when everything they depend on is unchanged: the
base model's weights (by sha256), the protocol, the seeds, the control, ``max_train``, DP-SGD
and the task's own data (source and example counts). Anything else is fine-tuned afresh.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from shoestring.data.tokenizer import load_tokenizer
from shoestring.errors import ShoestringError
from shoestring.eval.control import compare_arms, seeds_for
from shoestring.eval.finetune import PROTOCOLS, SWEEP_GRID, Pretrained, Protocol, TaskSettings
from shoestring.eval.finetune import run_task
from shoestring.privacy.dp_sgd import PrivateTraining
from shoestring.eval.glue import GLUE_TASKS, load_glue_task, parse_task_list
from shoestring.eval.downstream_report import (
    REFERENCES,
    glue_averages,
    render_chart,
    render_markdown,
    score_columns,
)
from shoestring.eval.tasks import CustomTask, TaskData, load_custom_task
from shoestring.fsutil import (
    check_output_dir,
    file_sha256,
    json_object_or_none,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from shoestring.model.encoder import MaskedLM
from shoestring.model.detector import as_encoder
from shoestring.rundir import RunDir

FORMAT = "shoestring-downstream/2"  # 2: per-task seeds, the scratch control, comparisons
CONTROLS = ("scratch", "none")
SEED_RULE = ("5 seeds when the task's first evaluation split has fewer than 2,000 examples, "
             "else 3 (docs/eval.md)")
MARKER = ".shoestring-eval"

__all__ = ["evaluate_downstream", "glue_tasks_in"]


def glue_tasks_in(root: str | Path) -> list[str]:
    """GLUE tasks whose folder exists under ``root`` (all but WNLI for "hf")."""
    if str(root) == "hf":
        return [k for k in GLUE_TASKS if k != "wnli"]
    root = Path(root)
    if not root.is_dir():
        raise ShoestringError("GLUE directory not found", where=str(root), fix="check --glue")
    found = [k for k, t in GLUE_TASKS.items()
             if any((root / n).is_dir() for n in (t.folder, t.folder.lower(), t.name))]
    if not found:
        raise ShoestringError(
            "no GLUE task folders here (CoLA/, SST-2/, MRPC/, ...)",
            where=str(root),
            fix="point --glue at the folder that holds the task folders (official layout)",
        )
    return found


def _load_tasks(
    glue: str | Path | None, tasks: list[str] | None, custom: list[CustomTask], max_train: int | None
) -> list[TaskData]:
    names = tasks if tasks is not None else (glue_tasks_in(glue) if glue is not None else [])
    if names and glue is None:
        raise ShoestringError(
            "--tasks names GLUE tasks but no GLUE data was given",
            where="--tasks",
            fix="add --glue DIR (official GLUE layout) or --glue hf (needs a network)",
        )
    loaded = [load_glue_task(glue, n, max_train) for n in names]  # type: ignore[arg-type]
    for spec in custom:
        data = load_custom_task(spec)
        data.train = data.train[:max_train]
        loaded.append(data)
    seen: set[str] = set()
    for d in loaded:
        if d.spec.name in seen:
            raise ShoestringError(
                f"two tasks are named {d.spec.name!r}",
                where="--task",
                fix="give custom tasks distinct names (name=...)",
            )
        seen.add(d.spec.name)
    if not loaded:
        raise ShoestringError("no tasks to evaluate", fix="pass --glue DIR and/or --task SPEC")
    return loaded


# what a finished task's numbers depend on besides its own data; all must match to reuse it
RESUME_KEYS = ("format", "base", "protocol", "sweep_grid", "seeds", "control", "max_train",
               "privacy")


def finished_tasks(out: Path, results: dict[str, Any], data: list[TaskData]) -> dict[str, Any]:
    """The tasks of an earlier evaluation in ``out`` that this one may keep: same settings
    (``RESUME_KEYS``), same task data (``TaskData.facts``), and a saved classifier. Empty when
    none qualify."""
    path = out / "results.json"
    if not (out / MARKER).is_file() or not path.is_file():
        return {}
    before = json_object_or_none(path)
    if before is None or any(before.get(k) != results.get(k) for k in RESUME_KEYS):
        return {}
    kept: dict[str, Any] = {}
    for d in data:
        prev = before.get("tasks", {}).get(d.spec.name)
        if prev is None or not (out / "classifiers" / d.spec.name / "model.safetensors").is_file():
            continue
        if all(prev.get(k) == v for k, v in d.facts().items()):
            kept[d.spec.name] = prev
    return kept


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def evaluate_downstream(
    run_dir: str | Path,
    glue: str | Path | None = None,
    tasks: list[str] | str | None = None,
    custom: list[CustomTask] | None = None,
    protocol: str = "sane",
    seeds: int | None = None,
    out: str | Path | None = None,
    max_train: int | None = None,
    precision: str = "auto",
    overrides: dict[str, Any] | None = None,
    console: Console | None = None,
    control: str = "scratch",
    privacy: PrivateTraining | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Fine-tune a trained encoder run on GLUE and/or custom tasks; write and return results.

    ``seeds`` None picks per task by the rule in eval/control.py (5 for small dev sets, else
    3). ``control="scratch"`` also fine-tunes the same architecture from random
    initialization with the same seeds (and the same DP-SGD, if any) and reports the paired
    difference; "none" skips it. ``privacy``: fine-tune with DP-SGD (privacy/dp_sgd.py);
    settings it cannot honour for a task are refused before anything is written. ``resume``:
    keep the tasks an interrupted evaluation in ``out`` finished (``finished_tasks``)."""
    console = console or Console(stderr=True)
    if protocol not in PROTOCOLS:
        raise ShoestringError(f"unknown protocol {protocol!r}", where="--protocol",
                              fix=f"choose one of {', '.join(PROTOCOLS)}")
    if seeds is not None and seeds < 1:
        raise ShoestringError("need at least one seed", where="--seeds")
    if control not in CONTROLS:
        raise ShoestringError(f"unknown control {control!r}", where="--control",
                              fix=f"choose one of {', '.join(CONTROLS)}")
    if isinstance(tasks, str):
        tasks = parse_task_list(tasks)
    run = RunDir(run_dir)
    base, meta = _load_encoder(run)
    data = _load_tasks(glue, tasks, custom or [], max_train)
    proto = replace(PROTOCOLS[protocol], **(overrides or {}))
    if privacy is not None:
        privacy.check_protocol(protocol, [(d.spec.name, len(d.train)) for d in data],
                               proto.batch_size, proto.epochs)
    out = Path(out) if out is not None else run.downstream_dir
    pretrained = Pretrained(base, meta, load_tokenizer(run.tokenizer_path), run.tokenizer_path)
    results = _header(run, pretrained, proto, protocol, seeds, control, max_train, privacy)
    kept = _prepare_out(out, results, data, resume, console)
    t0 = time.perf_counter()
    for d in data:
        if d.spec.name in kept:
            results["tasks"][d.spec.name] = kept[d.spec.name]
            continue
        n_seeds = seeds if seeds is not None else seeds_for(len(next(iter(d.evals.values()))))
        how = TaskSettings(proto, list(range(n_seeds)), out_dir=out / "classifiers",
                           precision=precision, grid=SWEEP_GRID if protocol == "sweep" else None,
                           privacy=privacy)
        res = _fine_tune_task(pretrained, d, how, control, console)
        results["tasks"][d.spec.name] = res
        results["machine"].update(device=res["device"], dtype=res["dtype"],
                                  threads=torch.get_num_threads())
        _write(out, results, t0, final=False)
    _write(out, results, t0, final=True)
    return results


def _load_encoder(run: RunDir) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The run's trained model, refused unless it is an encoder (masked LM; an RTD run's
    discriminator)."""
    base, meta = as_encoder(*run.load_final())
    if not isinstance(base, MaskedLM):
        raise ShoestringError(
            f"fine-tuning on tasks needs an encoder (masked LM); this run is "
            f"{meta.get('architecture')!r}",
            where=str(run.path),
            fix="for decoder runs use --text (perplexity), --choices (multiple choice), --samples",
        )
    return base, meta


def _header(run: RunDir, base: Pretrained, proto: Protocol, protocol: str, seeds: int | None,
            control: str, max_train: int | None, privacy: PrivateTraining | None
            ) -> dict[str, Any]:
    """results.json before any task: what every task's numbers depend on (``RESUME_KEYS``)."""
    meta = base.meta
    return {
        "format": FORMAT,
        "run": str(run.path),
        "run_name": run.path.resolve().name,
        "base": {"architecture": meta.get("architecture"), "model": meta.get("model"),
                 "vocab_size": meta.get("vocab_size"),
                 "params": sum(p.numel() for p in base.model.parameters()),
                 "weights_sha256": file_sha256(run.final_dir / "model.safetensors")},
        "protocol": asdict(proto),
        "sweep_grid": SWEEP_GRID if protocol == "sweep" else None,
        "seeds": "auto" if seeds is None else list(range(seeds)),
        "seed_rule": SEED_RULE if seeds is None else "fixed by --seeds",
        "control": control,
        "max_train": max_train,
        **({"privacy": privacy.settings()} if privacy is not None else {}),
        "tasks": {},
        "columns": [],
        "glue_average": None,
        "references": REFERENCES,
        "machine": {"load_average_start": _loadavg()},
        "wall_seconds": 0.0,
    }


def _prepare_out(out: Path, results: dict[str, Any], data: list[TaskData], resume: bool,
                 console: Console) -> dict[str, Any]:
    """Make ``out`` ready; returns the finished tasks it keeps (``resume``), else none."""
    kept = finished_tasks(out, results, data) if resume else {}
    if kept:
        console.print(f"resuming {out}: keeping {', '.join(kept)} (finished, same settings)")
        results["resumed"] = {"kept_tasks": list(kept)}
        for old in (out / "classifiers").iterdir():
            if old.name not in kept:  # refitted below, or no longer asked for
                shutil.rmtree(old)
        return kept
    check_output_dir(out, "evaluation folder", owned=(out / MARKER).is_file(), overwrite=True)
    if out.is_dir() and (out / MARKER).is_file():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("shoestring downstream evaluation\n", encoding="utf-8")
    return kept


def _fine_tune_task(base: Pretrained, d: TaskData, how: TaskSettings, control: str,
                    console: Console) -> dict[str, Any]:
    """One task's result: fine-tuned from ``base``, and from scratch for the control arm."""
    console.print(f"[bold]{d.spec.name}[/]: {len(d.train):,} train, "
                  + ", ".join(f"{len(v):,} {k}" for k, v in d.evals.items())
                  + (f" (skipped malformed rows: {d.skipped})" if d.skipped else ""))
    res = run_task(base, d, how, console=console)
    if control == "scratch":
        ctrl = run_task(base, d, replace(how, out_dir=None, from_scratch=True), console=console)
        res["control"] = {k: ctrl[k] for k in
                          ("init", "seeds", "summary", "protocol", "sweep", "wall_seconds")
                          if k in ctrl}
        res["comparison"] = {split: compare_arms(res["seeds"], ctrl["seeds"], split)
                             for split in d.evals}
    return res


def _write(out: Path, results: dict[str, Any], t0: float, final: bool) -> None:
    results["wall_seconds"] = time.perf_counter() - t0
    results["columns"] = score_columns(results["tasks"])
    results["glue_average"] = glue_averages(results["columns"])
    results["complete"] = final
    if final:
        results["machine"]["load_average_end"] = _loadavg()
    write_json_atomic(out / "results.json", results)
    if final:
        write_text_atomic(out / "results.md", render_markdown(results))
        write_bytes_atomic(out / "results.png", render_chart(results))
