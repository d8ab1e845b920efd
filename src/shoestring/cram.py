"""`shoestring cram`: the whole pipeline on one corpus, ending in a results table.

prep runs the same curation as `shoestring prep` (`curate.*`, exact dedup by default), so a
cram run and prep + train on the same settings train on the same data. The data dir is reused
when it was built from the same sources, data and curation settings (its manifest's
fingerprint matches), so a second `make demo` spends its time training, not
re-tokenizing. The run dir is replaced each time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shoestring.config import Config
from shoestring.consoles import err, out
from shoestring.data.datadir import DataDir, data_fingerprint
from shoestring.prep.prep import prep
from shoestring.device import load_cost
from shoestring.errors import ShoestringError
from shoestring.eval.mlm_loss import detection_rows, evaluate_run
from shoestring.train.forecast import outcome_line
from shoestring.train.loop import train


@dataclass
class CramResult:
    manifest: dict
    summary: dict
    evaluation: dict
    data_dir: Path
    run_dir: Path
    downstream: dict[str, Any] | None = field(default=None)
    plan: dict[str, Any] | None = field(default=None)  # --auto: the calibrated plan's tree
    wall_s: float | None = field(default=None)

    def table(self) -> Table:
        m, s, e = self.manifest, self.summary, self.evaluation
        docs, tr = m["documents"], m["splits"]["train"]
        t = Table(title="shoestring cram: results", show_header=False)
        t.add_row("corpus", f"{', '.join(m['sources'])}: {docs['kept']:,} documents, "
                  f"{docs['characters'] / 1e6:.1f}M characters")
        t.add_row("training data", f"{tr['tokens']:,} tokens in {tr['sequences']:,} sequences of {m['seq_len']}")
        t.add_row("model", f"{s['params'] / 1e6:.2f}M parameters ({s['params_non_embedding'] / 1e6:.2f}M non-embedding)")
        t.add_row("tokens seen", f"{s['tokens']:,} in {s['steps']:,} steps, {s['train_seconds']:.0f}s "
                  f"({s['tokens'] / max(tr['tokens'], 1):.1f} epochs)")
        t.add_row("throughput", f"{s['tokens_per_s']:,.0f} tokens/s on {s['device']} ({s['dtype']})")
        t.add_row("MFU", f"{s['mfu']:.1%} of a measured {s['peak_flops'] / 1e9:,.0f} GFLOP/s")
        if s.get("sized_for_device"):
            t.add_row("sized for the device", s["sized_for_device"]["why"])
        t.add_row("speed choices", s["speed_choices"])
        if busy := load_cost(s.get("cpu_load")):
            t.add_row("machine load", busy)
        t.add_row("validation MLM loss", f"{e['mlm_loss']:.3f} (perplexity {e['perplexity']:.1f}, "
                  f"accuracy {e['accuracy']:.1%})")
        t.add_row("unigram baseline", f"{e['unigram_loss']:.3f} "
                  f"(the model is {e['unigram_loss'] - e['mlm_loss']:.2f} nats/token better)")
        for row in detection_rows(e):
            t.add_row(*row)
        if found := outcome_line(s.get("forecast")):
            t.add_row("the run's forecast", f"{found} (the validation subset's loss)")
        if self.plan is not None:
            _auto_rows(t, self)
        if self.downstream is not None:
            t.add_row(*downstream_line(self.downstream))
        t.add_row("artifacts", f"data: {self.data_dir}\nrun:  {self.run_dir}")
        return t


# The downstream line is a quick look, so it is cut to fit a demo's minutes; the full
# protocol is `shoestring eval RUN --task ...` (docs/eval.md).
CRAM_TASK_SEEDS = 3
CRAM_TASK_MAX_TRAIN = 2000


def downstream_line(results: dict[str, Any]) -> tuple[str, str]:
    """One table row: the task's pretrained score beside its scratch control."""
    from shoestring.eval.downstream_report import fmt_difference

    c = results["columns"][0]
    cut = f", first {results['max_train']:,} train examples" if results.get("max_train") else ""
    return (f"downstream: {c['column']} ({c['metric']})",
            f"{c['median']:.1f} pretrained vs {c['scratch']['median']:.1f} from scratch "
            f"(median of {c['seeds']} seeds{cut}); difference {fmt_difference(c['comparison'])}: "
            f"{c['comparison']['verdict']}")


def _auto_rows(t: Table, r: CramResult) -> None:
    """--auto: what calibration cost, the plan, and its prediction against the eval."""
    from shoestring.plan.prediction import check, describe, held_out

    p = r.plan["plan"]  # type: ignore[index]
    cal = p.get("calibration") or {}
    t.add_row("calibration", f"{cal.get('points')} runs, {cal.get('flops', 0):.3g} FLOPs = "
              f"{cal.get('flops_share', 0):.1%} of the budget (share {cal.get('share', 0):.0%}), "
              f"{cal.get('wall_s', 0):.0f} s wall; {cal.get('dir')}")
    t.add_row("plan", f"{p['model']['shape']} ({p['model']['params_non_embedding']:,} "
              f"non-embedding params) on {p['model']['tokens']:,.0f} tokens")
    checked = check(p.get("prediction"), held_out(r.evaluation))
    if checked is not None:
        t.add_row("plan's prediction", describe(checked))
    if r.wall_s is not None:
        t.add_row("wall clock", f"{r.wall_s:.0f} s in all (budget {p['budget']['input']})")


def _auto_config(cfg: Config, data_dir: Path, output: Path, spec: Any,
                 console: Console, spent_s: float = 0.0) -> tuple[Config, dict[str, Any], Path]:
    """--auto: calibrate on the prepared data, plan the rest of the budget, and the config
    that trains the plan (the plan's model/train sections over ``cfg``)."""
    from shoestring.config import read_plan_sections
    from shoestring.plan.calibrate import calibrated_plan
    from shoestring.plan.planner import PlanRequest, write_plan

    if cfg.train.budget is None:
        raise ShoestringError("--auto plans a FLOP or wall-clock budget, not a step count",
                              where="--steps", fix="pass --budget (e.g. 10m or 1e14flops)")
    timed = cfg.train.budget.kind == "seconds"
    req = PlanRequest(hardware="auto", budget=cfg.train.budget, data=str(data_dir),
                      measure=timed)
    tree = calibrated_plan(req, spec, root=output / "calibration", console=console,
                           spent_s=spent_s, without="cram without --auto (the recipe's model)")
    plan_path = write_plan(tree, output / "plan.yaml")
    merged = cfg.model_dump()
    for section, values in read_plan_sections(plan_path).items():
        merged.setdefault(section, {}).update(values)
    return Config.model_validate(merged), tree, plan_path


def _to_deadline(cfg: Config, tree: dict[str, Any], spent_s: float,
                 console: Console) -> tuple[Config, float | None]:
    """--auto with a wall-clock budget: the plan's model trains to the budget's deadline, not
    to the FLOPs the plan estimated at the calibration's MFU, so a slower run ends on time and
    a faster one uses the time. The deadline leaves room for what the trainer does not charge
    to its budget and cram does after it — the periodic and final validation and the held-out
    evaluation — estimated at the plan's FLOP rate for a forward pass (a third of a training
    step's FLOPs per token). A FLOP budget is kept as planned. Returns the config and the
    seconds left to train (None: no deadline), from which `train` is given its deadline."""
    from shoestring.units import BudgetSpec, parse_budget

    meta = tree["plan"]
    budget = parse_budget(meta["budget"]["input"])
    if budget.kind != "seconds":
        return cfg, None
    rate = meta["hardware"]["peak_flops"] * meta["hardware"]["devices"] * meta["budget"]["mfu"]
    seq_len = tree["data"]["seq_len"]
    checks = (round(1 / cfg.train.val_every) if cfg.train.val_every > 0 else 0) + 1
    tokens = (cfg.eval.max_sequences + checks * cfg.train.val_sequences) * seq_len
    reserve = tokens * meta["model"]["flops_per_token"] / 3 / rate
    left = budget.amount - spent_s - reserve
    if left <= 0:
        raise ShoestringError(
            f"{spent_s:.0f} s went on preparing and calibrating, and evaluating needs about "
            f"{reserve:.0f} s: nothing of the {budget.amount:.0f} s budget is left to train",
            where="--budget", fix="give a longer budget or a FLOP budget")
    console.print(f"the plan's run trains to the budget's deadline: {left:.0f} s (the budget's "
                  f"{budget.amount:.0f} s, less {spent_s:.0f} s spent and {reserve:.0f} s "
                  "kept for validation and evaluation)")
    left_text = f"{left:.3f}"
    deadline = BudgetSpec("seconds", float(left_text), f"{left_text}s")
    return cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"budget": deadline, "steps": None})}), left


def parse_eval_task(spec: str) -> tuple[str | None, list[str] | None, list[Any]]:
    """``--eval-task``: a GLUE task folder (``.../glue/SST-2``) or a custom task spec as for
    ``eval --task``; returns (glue root, GLUE task keys, custom tasks) after reading and
    checking the files, so a bad task fails before any training."""
    from shoestring.eval.glue import GLUE_TASKS, load_glue_task
    from shoestring.eval.tasks import load_custom_task, parse_task_arg

    path = Path(spec)
    if path.is_dir():
        names = {t.folder.lower(): k for k, t in GLUE_TASKS.items()} | {k: k for k in GLUE_TASKS}
        key = names.get(path.name.lower())
        if key is None:
            raise ShoestringError(
                f"{path.name!r} is not a GLUE task folder ({', '.join(t.folder for t in GLUE_TASKS.values())})",
                where="--eval-task",
                fix="point at one task folder of the official GLUE layout, or give a task spec "
                "(YAML file or train=..,dev=..,text=..,label=..)",
            )
        load_glue_task(path.parent, key, max_train=CRAM_TASK_MAX_TRAIN)
        return str(path.parent), [key], []
    if "=" not in spec and not path.exists() and path.suffix.lower() not in (".yaml", ".yml"):
        raise ShoestringError(  # a folder's path, and nothing is there
            "no such task folder or task spec file",
            where=f"--eval-task {spec}",
            fix="point at a GLUE task folder (.../glue/SST-2) or a task YAML file that exists, "
            "or give a spec: train=t.csv,dev=d.csv,text=review,label=y",
        )
    try:
        task = parse_task_arg(spec)
    except ShoestringError as e:  # the spec grammar is eval's --task; name the flag used here
        if e.where != "--task":
            raise
        raise ShoestringError(e.what, where="--eval-task", fix=e.fix) from None
    load_custom_task(task)
    return None, None, [task]


def _reusable_manifest(data_dir: Path, fingerprint: str) -> dict | None:
    """The existing data dir's manifest if it was built from the same inputs and is intact."""
    if not (data_dir / "manifest.json").is_file():
        return None
    try:
        data = DataDir(data_dir)
        if data.manifest.get("fingerprint") != fingerprint:
            return None
        data.split("train", verify=True)
        data.split("val", verify=True)
    except ShoestringError:
        return None
    return data.manifest


def cram(sources: list[str], output: str | Path, cfg: Config, console: Console | None = None,
         eval_task: str | None = None, auto: Any = None) -> CramResult:
    """prep → train → held-out MLM loss, and with ``eval_task`` one downstream task fine-tuned
    from the run and from scratch (``CRAM_TASK_SEEDS`` seeds, ``CRAM_TASK_MAX_TRAIN`` rows).
    ``auto`` (a `CalibrationSpec`): calibrate on the data, train the calibrated plan of the
    rest of the budget, and check its prediction."""
    import time

    start = time.perf_counter()
    console = console or Console(stderr=True)
    output = Path(output)
    task = parse_eval_task(eval_task) if eval_task is not None else None
    data_dir, run_dir = output / "data", output / "run"
    manifest = _reusable_manifest(data_dir, data_fingerprint(sources, cfg.data, cfg.curate))
    if manifest is not None:
        console.print(f"reusing prepared data in {data_dir} (same sources and settings)")
    else:
        manifest = prep(sources, data_dir, cfg.data, console=console, curate=cfg.curate,
                        overwrite=True)
    tree, deadline = None, None
    if auto is not None:
        cfg, tree, plan_path = _auto_config(cfg, data_dir, output, auto, console,
                                            spent_s=time.perf_counter() - start)
        cfg, left = _to_deadline(cfg, tree, time.perf_counter() - start, console)
        if left is not None:
            deadline = time.perf_counter() + left
    sizing = None
    if auto is None:  # --auto's plan sized it already
        from shoestring.plan.device_size import for_this_device, note_in_summary

        cfg, sizing = for_this_device(cfg, data_dir, console)
    summary = train(cfg, data_dir, run_dir, overwrite=True, console=console, deadline=deadline)
    if sizing is not None:
        summary["sized_for_device"] = note_in_summary(run_dir, sizing)
    if tree is not None:
        from shoestring.plan.prediction import record

        summary["prediction"] = record(run_dir, plan_path)
    evaluation = evaluate_run(run_dir, data_dir, console=console)
    downstream = None
    if task is not None:
        from shoestring.eval.downstream import evaluate_downstream

        glue, names, custom = task
        downstream = evaluate_downstream(run_dir, glue=glue, tasks=names, custom=custom,
                                         seeds=CRAM_TASK_SEEDS, max_train=CRAM_TASK_MAX_TRAIN,
                                         console=console)
    return CramResult(manifest, summary, evaluation, data_dir, run_dir, downstream, tree,
                      time.perf_counter() - start if tree is not None else None)


def run(sources: list[str] | None, output: Path, cfg: Config, *, eval_task: str | None,
        auto: bool, calibrate_share: float, sets: list[str] | None, jobs: int) -> None:
    """`shoestring cram`: ``--auto`` as a `CalibrationSpec` checked before anything runs, then
    `cram` on ``sources`` (the built-in corpus by default), its table printed."""
    family = cfg.model.family
    if family.causal or not family.vocab_head:
        raise ShoestringError(
            f"cram pretrains an encoder and scores its masked-token predictions; "
            f"model.objective={cfg.model.objective} is {family.description}",
            where="model.objective", fix="--objective mlm (the default) or --objective rtd")
    spec = None
    if auto:
        from shoestring.plan.calibrate import CalibrationSpec

        spec = CalibrationSpec(share=calibrate_share, overrides=tuple(sets or []), jobs=jobs)
        spec.check()
    result = cram(sources or ["builtin:pydocs"], output, cfg, console=err, eval_task=eval_task,
                  auto=spec)
    out.print(result.table())
