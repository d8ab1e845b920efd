"""The `shoestring` command. Subcommands are thin: parse, call the library, print.

Bad input raises ShoestringError anywhere below; `main` prints its message and exits 2 with
no traceback. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperGroup

from shoestring import __version__
from shoestring.errors import ShoestringError
from shoestring.units import BUDGET_FORMS, counted

class _Argument(TyperArgument):
    """A positional argument shown by its metavar alone: ``SOURCES...`` in the usage line,
    not typer's ``{SOURCES}...`` and ``<list[str]>``."""

    def display_type_rich(self, ctx: click.Context) -> str | None:
        return None if self.metavar else super().display_type_rich(ctx)

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        if self.nargs != 1 and not name.endswith("..."):
            name += "..."
        return name if self.required else f"[{name}]"


class _Group(TyperGroup):
    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        for param in getattr(command, "params", []):
            if type(param) is TyperArgument:
                param.__class__ = _Argument
        return command


app = typer.Typer(
    cls=_Group,
    name="shoestring",
    help="Train the best language model a compute budget allows: "
    "plan → prep → train → eval → export → serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

LOG_WIDTH = 160  # columns when writing to a file or a pipe (a log, CI) with no COLUMNS set


def _console(stderr: bool = False) -> Console:
    """Rich's own width on a terminal or with COLUMNS set; otherwise ``LOG_WIDTH`` instead of
    rich's 80, which cut wide tables (GLUE's headers) in logs and CI."""
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, width=None if tty or os.environ.get("COLUMNS") else LOG_WIDTH)


out = _console()
err = _console(stderr=True)

ConfigOpt = Annotated[
    Optional[Path], typer.Option("--config", "-c", help="YAML file with data/model/train/eval sections.")
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override one setting: section.key=value (repeatable).", metavar="KEY=VALUE"),
]
BudgetOpt = Annotated[
    Optional[str], typer.Option("--budget", "-b", help=f"Training budget: {BUDGET_FORMS}.")
]
StepsOpt = Annotated[
    Optional[int],
    typer.Option("--steps", min=1, help="Train for exactly N optimizer steps instead of a time budget."),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"shoestring {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """shoestring: plan → prep → train → eval on any budget, from a laptop CPU up."""


def _config(config: Path | None, sets: list[str] | None, extra: list[str] | None = None,
            plan: Path | None = None, flags: dict[str, tuple[str, object]] | None = None):
    """``flags``: option name → (dotted key, value) for the options given (None: not given)."""
    from shoestring.config import load_config

    given = {name: kv for name, kv in (flags or {}).items() if kv[1] is not None}
    return load_config(config, [*(extra or []), *(sets or [])], plan=plan, flags=given)


def _parallel_overrides(text: str | None) -> list[str]:
    """``--parallel dp=2,tp=2`` as the whole set of ``parallel.*`` degrees (the ones it does
    not name go back to their defaults)."""
    if text is None:
        return []
    from shoestring.dist.layout import parse_parallel

    given = parse_parallel(text)
    defaults = {"dp": "null", "dp_replicate": "null", "dp_shard": "null", "tp": 1, "pp": 1}
    return [f"parallel.{k}={given.get(k, v)}" for k, v in defaults.items()]


def _budget_overrides(budget: str | None, steps: int | None) -> list[str]:
    from shoestring.units import parse_budget

    extra = []
    if budget is not None and steps is not None:
        raise ShoestringError(
            "--budget and --steps both say how long to train, and only one can apply",
            where="--steps", fix="pass one of them: --budget 500steps and --steps 500 are the same")
    if budget is not None:
        parse_budget(budget, where="--budget")  # named for the flag, before the config's check
        extra += [f"train.budget={budget}", "train.steps=null"]
    if steps is not None:
        extra += [f"train.steps={steps}", "train.budget=null"]
    return extra


@app.command()
def prep(
    sources: Annotated[
        list[str],
        typer.Argument(
            help="Files (.txt .jsonl .json .parquet .csv .tsv, optionally .gz/.zst/.bz2), "
            "folders, globs, hf:NAME[:CONFIG][:SPLIT], or builtin:pydocs.",
            show_default=False,
            metavar="SOURCES",
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Data dir to write.")],
    config: ConfigOpt = None,
    sets: SetOpt = None,
    objective: Annotated[
        Optional[str], typer.Option("--objective", help="mlm (encoder) or clm (decoder) packing.")
    ] = None,
    tokenizer: Annotated[
        Optional[str],
        typer.Option("--tokenizer", help="auto, wordpiece, bpe, unigram, or a tokenizer.json path."),
    ] = None,
    text_field: Annotated[
        Optional[str], typer.Option("--text-field", help="JSON field / column with the text.")
    ] = None,
    split_on: Annotated[
        Optional[str], typer.Option("--split-on", metavar="blank|lines|none",
                                    help=".txt files: a document per paragraph between blank lines "
                                    "(default), per line (WikiText-style files), or per file.")
    ] = None,
    on_error: Annotated[
        Optional[str], typer.Option("--on-error", help="Bad records: 'raise' (default) or 'skip'.")
    ] = None,
    workers: Annotated[
        Optional[int], typer.Option("--workers", "-j", min=1, help="Processes for cleaning/tokenizing.")
    ] = None,
    filters: Annotated[
        Optional[str], typer.Option("--filters", help="Quality filters: 'gopher' or 'none' (default).")
    ] = None,
    dedup: Annotated[
        Optional[str],
        typer.Option("--dedup", help="'none', 'exact' (default), 'fuzzy' (exact + MinHash LSH) or "
                     "'substring' (exact + repeated spans of --min-span words cut)."),
    ] = None,
    min_span: Annotated[
        Optional[int], typer.Option("--min-span", help="Substring dedup: shortest repeated span cut, in words (50).")
    ] = None,
    canaries: Annotated[
        Optional[int], typer.Option("--canaries", help="Insert K random secrets into train for `shoestring audit`.", metavar="K")
    ] = None,
    canary_repeats: Annotated[
        Optional[int], typer.Option("--canary-repeats", help="Copies of each canary (1).", metavar="R")
    ] = None,
    decontam: Annotated[
        Optional[list[str]],
        typer.Option("--decontam", help="Evaluation file/folder whose 13-grams are removed (repeatable).",
                     metavar="PATH"),
    ] = None,
    dedup_against: Annotated[
        Optional[list[str]],
        typer.Option("--dedup-against", metavar="DATA_DIR",
                     help="Also drop documents (near-)duplicating an earlier data dir, from the "
                     "dedup index prep kept there (repeatable)."),
    ] = None,
    explain: Annotated[
        Optional[int], typer.Option("--explain", min=0, help="Print N dropped documents per reason.")
    ] = None,
    mix: Annotated[
        Optional[str],
        typer.Option("--mix", metavar="NAME=W,…|NAME=Ex,…|RECIPE.yaml",
                     help="A data mixture: each source's share of the training tokens "
                     "(wikipedia=0.6,gutenberg=0.4), or its epochs (wikipedia=2x,gutenberg=1x), "
                     "or a YAML recipe (docs/data.md, Mixtures)."),
    ] = None,
    mix_field: Annotated[
        Optional[str], typer.Option("--mix-field", metavar="FIELD",
                                    help="With --mix: the JSON field naming each document's "
                                    "source (default: source).")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing data dir.")] = False,
    executor: Annotated[
        str, typer.Option("--executor", metavar="local|ray",
                          help="local: this machine (default); ray: a Ray cluster (docs/data.md).")
    ] = "local",
    ray_address: Annotated[
        Optional[str], typer.Option("--ray-address", metavar="auto|HOST:PORT",
                                    help="With --executor ray: the cluster to join "
                                    "(default: start Ray on this machine).")
    ] = None,
) -> None:
    """Clean, split, train a tokenizer, tokenize and pack SOURCES into a data dir.

    An interrupted prep resumes when re-run with the same inputs and settings.
    """
    from shoestring.fsutil import unique_paths
    from shoestring.prep.prep import build_dir, prep as run_prep

    options = {"--objective": ("data.objective", objective), "--tokenizer": ("data.tokenizer", tokenizer),
               "--text-field": ("data.text_field", text_field), "--split-on": ("data.split_on", split_on),
               "--on-error": ("data.on_error", on_error), "--workers": ("data.workers", workers),
               "--filters": ("curate.filters", filters), "--dedup": ("curate.dedup", dedup),
               "--explain": ("curate.explain", explain),
               "--min-span": ("curate.substring_min_span", min_span),
               "--canaries": ("curate.canaries", canaries),
               "--canary-repeats": ("curate.canary_repeats", canary_repeats),
               **_mix_option(mix, mix_field)}
    cfg = _config(config, sets, flags=options)
    if decontam:
        cfg.curate.decontam = [*cfg.curate.decontam, *decontam]
    if dedup_against:
        cfg.curate.dedup_against = unique_paths([*cfg.curate.dedup_against, *dedup_against])
    ray_options = _ray_options(executor, ray_address)
    try:
        manifest = run_prep(sources, output, cfg.data, console=err, curate=cfg.curate,
                            overwrite=overwrite, executor=executor, executor_options=ray_options)
    except KeyboardInterrupt:
        err.print(f"interrupted: finished stages are kept in {build_dir(output)}; "
                  "run the same command again to resume", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    _print_prep(manifest, output)


def _mix_option(mix: str | None, mix_field: str | None) -> dict[str, tuple[str, Any]]:
    """``--mix`` (and ``--mix-field``) as the ``data.mixture`` setting."""
    if mix_field is not None and mix is None:
        raise ShoestringError("--mix-field needs --mix", where="--mix-field")
    if mix is None:
        return {}
    from shoestring.data.mixture import parse_mix

    return {"--mix": ("data.mixture", parse_mix(mix, mix_field))}


def _ray_options(executor: str, address: str | None):
    if executor not in ("local", "ray"):
        raise ShoestringError(f"unknown executor {executor!r}", where="--executor",
                              fix="use local or ray")
    if executor == "local":
        if address is not None:
            raise ShoestringError("--ray-address needs --executor ray", where="--ray-address")
        return None
    from shoestring.prep.ray import RayOptions

    return RayOptions(address=address)


def _read_rows(t: Table, block: dict) -> None:
    """What ``--on-error skip`` skipped and what ``data.max_document_chars`` cut."""
    skipped = block.get("skipped") or {}
    if skipped.get("inputs"):
        t.add_row("skipped (bad input)", f"{skipped['records']:,} records, "
                  f"{skipped['files']:,} files ({skipped['bytes']:,} bytes)")
    long = block.get("long_documents") or {}
    if long.get("cut"):
        t.add_row("long documents", f"{long['cut']:,} over {long['max_chars']:,} characters "
                  f"cut into {long['pieces']:,} pieces")


def _print_prep(manifest: dict, output: Path) -> None:
    docs, splits = manifest["documents"], manifest["splits"]
    t = Table(title=f"prepared {output}", show_header=False)
    for block in manifest.get("blocks", []):
        if "documents_out" not in block:
            continue
        shown = f"{block['documents_in']:,} → " if "documents_in" in block else ""
        dropped = ", ".join(f"{n:,} {why.replace('_', ' ')}"
                            for why, n in block.get("dropped", {}).items() if n)
        label = "documents read" if block["block"] == "read" else f"{block['block']} (documents)"
        t.add_row(label,
                  f"{shown}{block['documents_out']:,}" + (f" (dropped {dropped})" if dropped else ""))
        if block["block"] == "read":
            _read_rows(t, block)
        if block["block"] == "substring_dedup":
            t.add_row("substring dedup (spans)", f"{block['spans_removed']:,} repeats of ≥ "
                      f"{block['min_span_words']} words cut ({block['bytes_removed']:,} bytes)")
    for old in manifest.get("dedup_against", []):
        dropped = ", ".join(f"{n:,} by {b.replace('_', ' ')}" for b, n in old["dropped"].items())
        t.add_row("deduped against", f"{old['path']} ({old['indexed']['exact']:,} texts "
                  f"indexed): dropped {dropped}")
    for block in manifest.get("blocks", []):
        if block["block"] == "canaries":
            t.add_row("canaries", f"{block['canaries']} ({block['copies_inserted']:,} copies, "
                      f"{block['copies_in_train']:,} in train after curation; {block['file']})")
    t.add_row("kept (train / val)", f"{docs['kept']:,} ({docs['train']:,} / {docs['val']:,})")
    split = manifest.get("split") or {}
    if split.get("method") == "position":
        t.add_row("validation", f"the last {split['val_fraction']:.0%} of the text "
                  "(too few documents to hold out whole ones)")
    tok = manifest["tokenizer"]
    short = (f"; {tok['requested_vocab_size']:,} asked for: too little text"
             if tok.get("warning") else "")
    t.add_row("vocabulary", f"{tok['vocab_size']:,} {tok.get('kind', 'wordpiece')} "
              f"({manifest.get('objective', 'mlm')}{short})")
    for name in ("train", "val"):
        s = splits[name]
        t.add_row(f"{name} sequences × {manifest['seq_len']}", f"{s['sequences']:,} ({s['tokens']:,} tokens)")
    for name, src in ((manifest.get("mixture") or {}).get("sources") or {}).items():
        t.add_row(f"source {name}", f"{src['weight']:.1%} of training; {src['train_tokens']:,} "
                  f"train / {src['val_tokens']:,} val tokens")
    resumed = manifest.get("resumed") or {}
    if resumed.get("stages") or resumed.get("kept_shards"):
        t.add_row("resumed", f"stages {', '.join(resumed['stages']) or '-'}; "
                  f"{counted(resumed['kept_shards'], 'shard')} kept (checksums verified)")
    t.add_row("time", f"{manifest['seconds']:.1f}s")
    out.print(t)


@app.command()
def train(
    data: Annotated[Path, typer.Option("--data", "-d", help="Data dir written by `shoestring prep`.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Run dir to write.")],
    budget: BudgetOpt = None,
    steps: StepsOpt = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing run dir.")] = False,
    plan: Annotated[
        Optional[Path], typer.Option("--plan", help="Plan file from `shoestring plan` (base config).")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run dir's newest checkpoint (its config.yaml + --set).")
    ] = False,
    init_from: Annotated[
        Optional[Path], typer.Option("--init-from", help="Start from these weights: a Hugging Face folder or run dir.")
    ] = None,
    parallel: Annotated[
        Optional[str], typer.Option("--parallel", help="Distributed layout under torchrun: dp=D,tp=T,pp=P (or dp_replicate/dp_shard); sets the config's parallel: section (see docs/distributed.md).", metavar="LAYOUT")
    ] = None,
    zero: Annotated[Optional[int], typer.Option("--zero", help="ZeRO stage 0-3 (DDP, sharded optimizer, FSDP2 without/with reshard): parallel.zero.")] = None,
    offload: Annotated[Optional[str], typer.Option("--offload", help="'cpu' offloads sharded state (ZeRO 2/3, CUDA): parallel.offload.")] = None,
    ac: Annotated[Optional[str], typer.Option("--ac", help="Activation checkpointing none|selective|full: parallel.ac.")] = None,
    pp_schedule: Annotated[Optional[str], typer.Option("--pp-schedule", help="gpipe|1f1b|interleaved: parallel.pp_schedule.")] = None,
    microbatches: Annotated[Optional[int], typer.Option("--microbatches", help="With pp > 1: microbatches per step (default: stages): parallel.microbatches.")] = None,
) -> None:
    """Pretrain an encoder (masked LM) or decoder (causal LM) on a data dir within a budget."""
    from shoestring.train.loop import train as run_train

    extra = _budget_overrides(budget, steps)
    if init_from is not None:
        extra.append(f"train.init_from={init_from}")
    if resume:
        if config is not None or plan is not None:
            raise ShoestringError("--resume uses the run's own config.yaml", where="--config/--plan",
                                  fix="drop --config/--plan; change settings with --set")
        from shoestring.rundir import RunDir

        saved = RunDir(output).config_path
        if not saved.is_file():
            raise ShoestringError("nothing to resume: no config.yaml", where=str(output),
                                  fix="train without --resume to start a run here")
        config = saved
    cfg = _config(config, sets, extra + _parallel_overrides(parallel), plan=plan, flags={
        "--zero": ("parallel.zero", zero), "--offload": ("parallel.offload", offload),
        "--ac": ("parallel.ac", ac), "--pp-schedule": ("parallel.pp_schedule", pp_schedule),
        "--microbatches": ("parallel.microbatches", microbatches)})
    from shoestring.data.datadir import check_data_settings  # data.* as given (not a plan's)
    check_data_settings(_config(None if resume else config, sets), data)
    if plan is not None:
        from shoestring.plan.planner import hardware_mismatch

        warning = hardware_mismatch(plan)
        if warning and int(os.environ.get("RANK", "0")) == 0:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False)
    kept = None  # a resumed run keeps the prediction its plan gave it
    if resume:
        from shoestring.rundir import RunDir, read_json_object

        kept = (read_json_object(RunDir(output).summary_path) or {}).get("prediction")
    from shoestring.plan.device_size import for_this_device, note_in_summary

    cfg, sizing = for_this_device(cfg, data, console=err)  # a GPU, no size given: its own
    summary = run_train(cfg, data, output, overwrite=overwrite, console=err, resume=resume)
    if int(os.environ.get("RANK", "0")) == 0:
        summary["sized_for_device"] = note_in_summary(output, sizing)
        if plan is not None or kept:
            from shoestring.plan.prediction import record

            summary["prediction"] = record(output, plan, kept)
        _print_train(summary, output)


def _print_train(summary: dict, output: Path) -> None:
    t = Table(title=f"trained {output}", show_header=False)
    t.add_row("steps / tokens", f"{summary['steps']:,} / {summary['tokens']:,}")
    t.add_row("time", f"{summary['train_seconds']:.1f}s (+{summary['save_seconds']:.1f}s save, "
              f"+{summary.get('setup_seconds', 0.0):.1f}s setup: outside the budget)")
    t.add_row("tokens/s", f"{summary['tokens_per_s']:,.0f}")
    t.add_row("MFU", f"{summary['mfu']:.1%} of {summary['peak_flops'] / 1e9:,.0f} GFLOP/s measured ({summary['dtype']})")
    if summary.get("mfu_note"):
        t.add_row("", summary["mfu_note"])
    t.add_row("train loss", f"{summary['first_loss']:.3f} → {summary['final_train_loss']:.3f}")
    if summary.get("val_loss_subset") is not None:
        t.add_row("validation loss (subset)", f"{summary['val_loss_subset']:.3f}")
    if summary.get("skipped_steps"):
        t.add_row("skipped (non-finite)", f"{summary['skipped_steps']:,} steps")
    if summary.get("sized_for_device"):
        t.add_row("sized for the device", summary["sized_for_device"]["why"])
    t.add_row("compile", f"{'on' if summary['compiled'] else 'off'}: {summary['speed_choices']}")
    from shoestring.device import load_cost

    if busy := load_cost(summary.get("cpu_load")):
        t.add_row("machine load", busy)
    if summary.get("prediction"):
        from shoestring.plan.prediction import line

        t.add_row("plan's prediction", line(summary["prediction"])
                  + f"; check it: shoestring eval {output}")
    out.print(t)


@app.command("eval")
def eval_(
    run: Annotated[Path, typer.Argument(help="Run dir written by `shoestring train`.", show_default=False, metavar="RUN_DIR")],
    data: Annotated[
        Optional[Path], typer.Option("--data", "-d", help="Data dir (default: the one the run trained on).")
    ] = None,
    sets: SetOpt = None,
    glue: Annotated[Optional[str], typer.Option("--glue", help="GLUE folder (official layout), or 'hf' to download.", metavar="DIR")] = None,
    tasks: Annotated[Optional[str], typer.Option("--tasks", help="GLUE tasks: cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte,wnli (or all/glue).")] = None,
    task: Annotated[Optional[list[str]], typer.Option("--task", help="Own task: YAML file, or train=..,dev=..,text=..,label=.. (repeatable).", metavar="SPEC")] = None,
    protocol: Annotated[str, typer.Option("--protocol", help="sane (Cramming: one setting for all tasks) or sweep (small per-task grid).")] = "sane",
    seeds: Annotated[str, typer.Option("--seeds", help="Fine-tuning seeds per task (median and spread); auto: 5 for dev sets under 2,000 examples, else 3.")] = "auto",
    control: Annotated[str, typer.Option("--control", help="scratch: also fine-tune the same architecture from random init (paired by seed); none: skip.")] = "scratch",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output folder (default: RUN_DIR/downstream).")] = None,
    max_train: Annotated[Optional[int], typer.Option("--max-train", min=1, help="Use only the first N training examples (a quick look, not the protocol).")] = None,
    precision: Annotated[str, typer.Option("--precision", help="auto, bf16 or fp32.")] = "auto",
    text: Annotated[Optional[Path], typer.Option("--text", help="Decoders: held-out .txt/.jsonl for perplexity (default: the run's val split).")] = None,
    choices: Annotated[Optional[Path], typer.Option("--choices", help="Decoders: JSONL of context/choices/answer, scored zero-shot.")] = None,
    samples: Annotated[int, typer.Option("--samples", min=0, help="Decoders: samples to show (greedy unless --temperature).")] = 3,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="Decoders: sample at this temperature (0 = greedy; a small decoder often loops when greedy).")] = 0.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k", min=1, help="Decoders: sample from the k likeliest tokens only.")] = None,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="Decoders: prompt for samples (repeatable).", metavar="TEXT")] = None,
    dp_epsilon: Annotated[Optional[float], typer.Option("--dp-epsilon", help="Fine-tune with DP-SGD (Opacus) to this ε (docs/privacy.md).")] = None,
    dp_delta: Annotated[Optional[float], typer.Option("--dp-delta", help="DP-SGD δ (1e-5).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Keep the tasks an interrupted fine-tuning in the output folder finished (same model, settings and task data).")] = False,
) -> None:
    """Evaluate a run: held-out MLM loss, fine-tuning on GLUE / own tasks, or decoder evals."""
    from shoestring.cli_eval import run_eval

    privacy = None
    if dp_epsilon is not None or dp_delta is not None or any(
            s.startswith("eval.dp_") for s in sets or []):
        from shoestring.privacy.dp_sgd import PrivateTraining

        privacy = PrivateTraining.from_options(None, sets, dp_epsilon, dp_delta)
        if privacy is None:
            raise ShoestringError("--dp-delta without --dp-epsilon", where="--dp-delta",
                                  fix="add --dp-epsilon (e.g. 8)")
    run_eval(run, data=data, sets=sets, glue=glue, tasks=tasks, task=task, protocol=protocol,
             seeds=seeds, control=control, output=output, max_train=max_train,
             precision=precision, text=text,
             choices=choices, samples=samples, prompt=prompt, temperature=temperature,
             top_k=top_k, out=out, err=err,
             print_mlm=_print_eval, privacy=privacy, resume=resume)


def _print_eval(result: dict, run: Path) -> None:
    t = Table(title=f"evaluated {run}", show_header=False)
    t.add_row("validation MLM loss", f"{result['mlm_loss']:.3f} (perplexity {result['perplexity']:.1f}, "
              f"{result['mask_rate']:.0%} masked)")
    gap = result["mlm_loss"] - result["unigram_loss"]
    t.add_row("unigram baseline", f"{result['unigram_loss']:.3f} (guessing every masked token "
              "by its frequency)" + (f": the model is {gap:.3f} worse — it has not yet learned "
                                     "more than token frequencies; train longer" if gap > 0
                                     else f": the model is {-gap:.3f} better"))
    t.add_row("masked-token accuracy", f"{result['accuracy']:.1%}")
    t.add_row("scored", f"{result['masked_tokens']:,} masked tokens in {result['sequences']:,} sequences")
    from shoestring.plan.prediction import check_run, describe

    if (checked := check_run(run, result)) is not None:
        t.add_row("plan's prediction", describe(checked))
    out.print(t)


@app.command()
def audit(
    run: Annotated[Path, typer.Argument(help="Run dir written by `shoestring train`.", show_default=False, metavar="RUN_DIR")],
    data: Annotated[Path, typer.Option("--data", "-d", help="The data dir the run trained on (with canaries.json from prep --canaries).")],
    candidates: Annotated[int, typer.Option("--candidates", min=1, help="Random secrets each canary is ranked against.")] = 1000,
    sequences: Annotated[int, typer.Option("--sequences", min=2, help="Rows per split for membership inference.")] = 256,
    extract: Annotated[int, typer.Option("--extract", min=1, help="Decoders: prefixes per split for extraction.")] = 64,
) -> None:
    """Memorization audit: canary exposure, membership inference AUC, extraction (docs/privacy.md)."""
    from shoestring.privacy.audit import AuditSettings, audit as run_audit, audit_table

    result = run_audit(run, data, AuditSettings(candidates=candidates, sequences=sequences,
                                                extract=extract), console=err)
    out.print(audit_table(result))
    out.print(f"written: {run / 'audit.json'}")


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="Run dir written by `shoestring train`.", show_default=False, metavar="RUN_DIR")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write (Hugging Face format).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a previous export.")] = False,
    fmt: Annotated[str, typer.Option("--format", help="hf (Hugging Face: ModernBERT or Llama) or onnx (an encoder's or classifier's forward pass, fp32 and int8, for ONNX Runtime).")] = "hf",
) -> None:
    """Export a trained run in Hugging Face format (encoders as ModernBERT, decoders as Llama),
    or an encoder's or classifier's forward pass as ONNX (--format onnx)."""
    if fmt == "onnx":
        from shoestring.inference.engine import load_engine
        from shoestring.inference.onnx_runtime import export_folder

        path = export_folder(load_engine(run), output, overwrite=overwrite)
        err.print(f"exported {path}: model.onnx (fp32), model.int8.onnx, tokenizer.json, "
                  "onnx.json (inputs and outputs)", markup=False, highlight=False)
        return
    if fmt != "hf":
        raise ShoestringError(f"{fmt!r} is not an export format", where="--format",
                              fix="use hf or onnx")
    from shoestring.export.hub import export_run

    path = export_run(run, output, overwrite=overwrite)
    _print_export(path)


def _print_export(path: Path) -> None:
    import json

    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    t = Table(title=f"exported {path}", show_header=False)
    t.add_row("architecture", f"{cfg['architectures'][0]} (model_type {cfg['model_type']})")
    t.add_row("size", f"{cfg['num_hidden_layers']} layers × {cfg['hidden_size']} hidden, "
              f"{cfg['num_attention_heads']} heads, {cfg['intermediate_size']} GLU")
    t.add_row("vocabulary", f"{cfg['vocab_size']:,}")
    from shoestring import families

    auto = families.by_hf_model_type(cfg["model_type"], where=str(path)).hf_auto_class
    t.add_row("load with", f"{auto}.from_pretrained({str(path)!r})")
    out.print(t)


@app.command()
def cram(
    sources: Annotated[
        Optional[list[str]],
        typer.Argument(
            help="Corpus to use (default: builtin:pydocs, shipped with Python).",
            show_default=False,
            metavar="SOURCES",
        ),
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for data/ and run/.")] = Path("runs/cram"),
    budget: BudgetOpt = None,
    steps: StepsOpt = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
    eval_task: Annotated[Optional[str], typer.Option("--eval-task", help="Also fine-tune on one task (a GLUE task folder, or a spec as for eval --task) from the run and from scratch.", metavar="TASK")] = None,
    auto: Annotated[bool, typer.Option("--auto", help="Calibrate the scaling law on this data and machine with a share of the budget, then train the plan it gives for the rest (plan --calibrate).")] = False,
    calibrate_share: Annotated[float, typer.Option("--calibrate-share", help="With --auto: most of the budget's FLOPs calibration may spend.")] = 0.15,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="With --auto: calibration points trained at once, the CPU cores split between them.")] = 1,
) -> None:
    """Everything on the built-in corpus: prep → train (3 minutes) → eval → results table."""
    from shoestring.cram import cram as run_cram

    cfg = _config(config, sets, _budget_overrides(budget, steps))
    spec = None
    if auto:
        from shoestring.plan.calibrate import CalibrationSpec

        spec = CalibrationSpec(share=calibrate_share, overrides=tuple(sets or []), jobs=jobs)
        spec.check()
    result = run_cram(sources or ["builtin:pydocs"], output, cfg, console=err, eval_task=eval_task,
                      auto=spec)
    out.print(result.table())


@app.command()
def serve(
    models: Annotated[
        list[str],
        typer.Argument(help="Run dir, `shoestring export` folder, classifier folder, transformers "
                       "encoder folder (BERT, sentence-transformers, ...; shoestring[hf]), or a "
                       "repository model NAME[:VERSION|:TAG] (several: requests pick one with \"model\").",
                       show_default=False, metavar="MODEL..."),
    ],
    host: Annotated[str, typer.Option(help="Address to listen on (loopback: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free port, printed at start).")] = 8000,
    max_batch_tokens: Annotated[int, typer.Option(help="Padded tokens (inputs × longest) per model call at most.")] = 16384,
    max_batch_size: Annotated[Optional[int], typer.Option(help="Inputs per model call at most (default: tokens decide).")] = None,
    max_wait_ms: Annotated[float, typer.Option(help="How long the oldest input waits for batch-mates (0: start when the model is free).")] = 0.0,
    max_queue: Annotated[int, typer.Option(help="Queued inputs before answering 429 + Retry-After.")] = 4096,
    max_concurrent_requests: Annotated[int, typer.Option(help="Requests handled at once before answering 429 + Retry-After.")] = 512,
    max_length: Annotated[Optional[int], typer.Option(help="Tokens per input, special tokens included (default: the context the model was trained on).")] = None,
    truncate: Annotated[
        bool, typer.Option("--truncate/--reject", help="Over-long input: cut it to --max-length, or answer 422.")
    ] = False,
    max_client_batch: Annotated[int, typer.Option(help="Texts in one request at most (split into batches; 413 above).")] = 1024,
    max_body_bytes: Annotated[int, typer.Option(help="Request body size limit (413 above it).")] = 1 << 20,
    max_new_tokens: Annotated[int, typer.Option(help="Generation: the most new tokens one request may ask.")] = 256,
    request_timeout: Annotated[float, typer.Option(help="Seconds before an unanswered request gets 504.")] = 30.0,
    body_timeout: Annotated[float, typer.Option(help="Seconds for a request's body to arrive after its headers (408 and the connection closed after).")] = 15.0,
    shutdown_timeout: Annotated[float, typer.Option(help="On Ctrl-C/SIGTERM, seconds to let in-flight requests finish.")] = 30.0,
    idle_timeout: Annotated[float, typer.Option(help="Seconds a connection may go without a whole request head (after it opens or after an answer) or without reading an answer before it is closed.")] = 30.0,
    max_connections: Annotated[int, typer.Option(help="Open connections at most: one more closes the longest-idle one (503 when none is idle).")] = 4096,
    max_header_bytes: Annotated[int, typer.Option(help="A request's line and headers at most (431 above it).")] = 16384,
    api_key: Annotated[
        Optional[str],
        typer.Option(envvar="SHOESTRING_API_KEY", show_envvar=True,
                     help="Require this key on /v1 and /metrics (Authorization: Bearer KEY or X-API-Key). "
                     "Prefer the environment variable: options show in the process list."),
    ] = None,
    precision: Annotated[str, typer.Option(help="fp32, bf16 (autocast), or auto (bf16 where faster).")] = "fp32",
    threads: Annotated[
        Optional[int], typer.Option(help="torch threads per worker (default: the cores shared among workers).")
    ] = None,
    index: Annotated[
        Optional[Path], typer.Option("--index", help="Index dir (shoestring index): adds /v1/search and generate's retrieve option.", metavar="INDEX")
    ] = None,
    workers: Annotated[int, typer.Option(help="Engine processes behind the one port (replicas).")] = 1,
    backend: Annotated[str, typer.Option(help="Encoders' and classifiers' forward pass: auto (the fastest here that passes the accuracy gate), torch, onnx or onnx-int8 (ONNX Runtime). Decoders run on torch.")] = "auto",
) -> None:
    """Serve trained models over HTTP with token-budget batching (docs/serving.md)."""
    from shoestring.serve.server import serve as run_serve
    from shoestring.serve.settings import make_settings

    settings = make_settings(
        host=host, port=port, max_batch_tokens=max_batch_tokens, max_batch_size=max_batch_size,
        max_wait_ms=max_wait_ms, max_queue=max_queue, max_concurrent_requests=max_concurrent_requests,
        max_length=max_length, truncate=truncate, max_client_batch=max_client_batch,
        max_body_bytes=max_body_bytes, max_new_tokens=max_new_tokens,
        request_timeout_s=request_timeout, body_timeout_s=body_timeout,
        shutdown_timeout_s=shutdown_timeout, idle_timeout_s=idle_timeout,
        max_connections=max_connections, max_header_bytes=max_header_bytes, api_key=api_key,
        precision=precision, threads=threads, index=str(index) if index else None,
        workers=workers, backend=backend)
    if not settings.loopback and settings.api_key is None:
        err.print(f"[yellow]warning:[/] listening on {host} without --api-key: anyone who can "
                  "reach this machine can use the model")
    run_serve(models, settings,
              announce=lambda msg: err.print(msg, markup=False, highlight=False, soft_wrap=True))


ModeOpt = Annotated[str, typer.Option("--mode", help="bm25 (lexical), dense (encoder embeddings) or hybrid (reciprocal-rank fusion of both).")]


@app.command()
def index(
    sources: Annotated[
        list[str],
        typer.Argument(help="Files, folders, globs, hf:NAME or builtin:pydocs (as for prep), or a "
                       "data dir (its sources are indexed).", show_default=False,
                       metavar="SOURCES|DATA_DIR"),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Index dir to write.")],
    encoder: Annotated[
        Optional[Path], typer.Option("--encoder", help="Encoder run dir, export or transformers encoder folder: adds a dense index of its embeddings.", metavar="RUN|HF_DIR")
    ] = None,
    passage_words: Annotated[int, typer.Option("--passage-words", min=1, help="Words per passage.")] = 100,
    text_field: Annotated[str, typer.Option("--text-field", help="JSON field / column with the text.")] = "text",
    split_on: Annotated[str, typer.Option("--split-on", help="Plain text: blank (paragraphs), lines, or none.")] = "blank",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an index dir built from other sources.")] = False,
) -> None:
    """Split documents into passages and index them: BM25, plus dense vectors with --encoder
    (docs/retrieval.md). Re-running with unchanged sources only redoes what changed."""
    from shoestring.retrieval.index import build_index

    manifest = build_index(sources, output, encoder=encoder, passage_words=passage_words,
                           text_field=text_field, split_on=split_on, overwrite=overwrite,
                           announce=lambda m: err.print(m, markup=False, highlight=False))
    done = ", ".join(manifest["rebuilt"]) or "nothing (up to date)"
    dense = f", dense {manifest['encoder']['dim']}-dim" if manifest["encoder"] else ""
    out.print(f"{output}: {counted(manifest['passages'], 'passage')} from "
              f"{counted(manifest['documents'], 'document')} (BM25{dense}); built: {done}",
              markup=False, highlight=False)


@app.command()
def search(
    index_dir: Annotated[Path, typer.Argument(help="Index dir (shoestring index -o).", show_default=False, metavar="INDEX")],
    query: Annotated[str, typer.Argument(help="What to look for.", show_default=False, metavar="QUERY")],
    k: Annotated[int, typer.Option("-k", min=1, help="Passages to return.")] = 5,
    mode: ModeOpt = "hybrid",
    encoder: Annotated[
        Optional[Path], typer.Option("--encoder", help="Encoder for the query (default: the one the index was built with; must have the same weights).", metavar="RUN|HF_DIR")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the hits as JSON lines.")] = False,
) -> None:
    """Search an index: the k best passages for QUERY, with their sources."""
    import json

    from shoestring.retrieval.index import RetrievalIndex, check_query

    check_query(query, "QUERY")
    idx = RetrievalIndex(index_dir, encoder=encoder)
    mode = mode if idx.has_dense or mode != "hybrid" or encoder else "bm25"
    for h in idx.search(query, k, mode, "QUERY"):
        if as_json:
            out.print(json.dumps(h.to_dict(), ensure_ascii=False), markup=False, highlight=False,
                      soft_wrap=True)
            continue
        text = " ".join(h.passage.text.split())
        out.print(f"{h.rank}. [{h.score:.4g}] {h.passage.cite}\n   {text[:300]}"
                  + ("…" if len(text) > 300 else ""), markup=False, highlight=False)


@app.command()
def ask(
    run: Annotated[Path, typer.Argument(help="Decoder run dir or export (model.objective=clm).", show_default=False, metavar="RUN")],
    question: Annotated[str, typer.Argument(help="The question.", show_default=False, metavar="QUESTION")],
    index_dir: Annotated[Path, typer.Option("--index", help="Index dir to retrieve from.", metavar="INDEX")],
    k: Annotated[int, typer.Option("-k", min=1, help="Passages to retrieve (fewer go in if the context is full).")] = 5,
    mode: ModeOpt = "hybrid",
    encoder: Annotated[Optional[Path], typer.Option("--encoder", help="Encoder for the query (default: the index's).", metavar="RUN|HF_DIR")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Answer length at most, in tokens.")] = 64,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy; e.g. 0.8 samples (a small decoder often loops when greedy).")] = 0.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k", min=1, help="Sampling: draw from the k likeliest tokens only.")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
) -> None:
    """Answer QUESTION with the decoder, its context holding the passages retrieved for it."""
    from shoestring.eval.decoder import describe_decoding
    from shoestring.retrieval.ask import ask as run_ask
    from shoestring.retrieval.ask import check_decoder
    from shoestring.retrieval.index import RetrievalIndex, check_query
    from shoestring.retrieval.passages import Passage
    from shoestring.inference.engine import load_engine

    check_query(question, "QUESTION")
    engine = load_engine(run, max_length=1 << 20)
    check_decoder(engine, str(run))
    idx = RetrievalIndex(index_dir, encoder=encoder)
    mode = mode if idx.has_dense or mode != "hybrid" or encoder else "bm25"
    result = run_ask(engine, idx, question, k=k, mode=mode, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, seed=seed)
    out.print(result["answer"] or "(empty answer)", markup=False, highlight=False)
    err.print(f"decoding: {describe_decoding(temperature, top_k, seed)}", markup=False,
              highlight=False)
    cut = " (the last one cut to fit)" if result["truncated"] else ""
    err.print(f"\npassages used ({len(result['passages'])} of {k} retrieved by {mode}{cut}; "
              f"prompt {result['prompt_tokens']} of {result['context']} tokens):",
              markup=False, highlight=False)
    for p in result["passages"]:
        err.print(f"{p['rank']}. {Passage(p['source'], p['doc_id'], p['offset'], '').cite}: "
                  f"{' '.join(p['text'].split())[:200]}", markup=False, highlight=False)


models_app = typer.Typer(
    help="The model repository ($SHOESTRING_HOME/models): push, list, tag, rm, verify.",
    no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("push")
def models_push(
    source: Annotated[Path, typer.Argument(help="Run dir, export folder or classifier folder.",
                                           show_default=False, metavar="RUN|HF_DIR")],
    name: Annotated[str, typer.Option("--name", "-n", help="Model name (lower case: a-z 0-9 . _ -).")],
) -> None:
    """Store a model as the next version of NAME (identical content is stored once)."""
    from shoestring.model_repository import ModelRepository

    version, new = ModelRepository().push(source, name)
    if new:
        out.print(f"stored {version.ref} (sha256 {version.manifest['sha256'][:12]}) in {version.path.parent}",
                  soft_wrap=True, highlight=False)
    else:
        out.print(f"{source} is already stored as {version.ref}: nothing to do", highlight=False)


@models_app.command("list")
def models_list(
    name: Annotated[Optional[str], typer.Argument(help="Only this model.", show_default=False)] = None,
) -> None:
    """The stored models and versions with their tags and eval metrics (and any repository
    file that is unreadable or holds bad entries, which are skipped)."""
    from shoestring.model_repository import ModelRepository

    repo = ModelRepository()
    versions = repo.versions(name)
    if not versions:
        out.print(f"no models in {repo.root}; store one with: shoestring models push RUN --name NAME",
                  highlight=False)
    else:
        t = Table(box=None, pad_edge=False, header_style="bold")
        for col in ("model", "version", "tags", "created", "kind", "metrics"):
            t.add_column(col)
        for v in versions:
            metrics = " ".join(f"{k}={x:.4g}" for k, x in v.manifest["metrics"].items())
            t.add_row(*(Text(str(c)) for c in (v.name, v.version, ",".join(v.tags),
                                              v.manifest.get("created", ""),
                                              v.manifest.get("kind", ""), metrics)))
        out.print(t)
    _repository_problems(repo)


def _repository_problems(repo: Any) -> None:
    """Each repository file a read skipped something of, on stderr (one line each)."""
    for path, problem in sorted(repo.problems.items()):
        err.print(f"[yellow]warning:[/] {escape(path)}: {escape(problem)}", soft_wrap=True,
                  highlight=False)


@models_app.command("tag")
def models_tag(
    ref: Annotated[str, typer.Argument(help="The version: NAME:VERSION (or NAME:TAG).", show_default=False,
                                       metavar="NAME:VERSION")],
    tag: Annotated[str, typer.Argument(help="Tag to point at it (moved if it exists).", show_default=False)],
) -> None:
    """Point a tag at a version; servers serving NAME:TAG follow it without a restart."""
    from shoestring.model_repository import ModelRepository

    v = ModelRepository().tag(ref, tag)
    out.print(f"{v.name}:{tag} → {v.ref}", highlight=False)


@models_app.command("rm")
def models_rm(
    ref: Annotated[str, typer.Argument(help="NAME (every version) or NAME:VERSION|TAG (one).",
                                       show_default=False, metavar="NAME[:VERSION]")],
    force: Annotated[bool, typer.Option("--force", help="Also remove a version a tag points at "
                                        "(what a server started with NAME:TAG serves).")] = False,
) -> None:
    """Remove a model, or one of its versions (a tagged one only with --force)."""
    from shoestring.model_repository import ModelRepository

    removed = ModelRepository().remove(ref, force=force)
    out.print(f"removed {', '.join(removed)}", highlight=False)


@models_app.command("verify")
def models_verify(
    ref: Annotated[Optional[str], typer.Argument(help="NAME or NAME:VERSION|TAG (default: every "
                                                 "stored version).", show_default=False,
                                                 metavar="[NAME[:VERSION]]")] = None,
) -> None:
    """Check stored versions' files against the sha256 recorded at push (exit 2 on a mismatch
    or an unusable manifest)."""
    from shoestring.model_repository import ModelRepository

    repo = ModelRepository()
    versions = repo.versions(ref) if ref is None or ":" not in ref else [repo.resolve(ref)]
    if ref and not versions and not repo.unusable:
        repo.resolve(ref)  # raises: no such model
    bad = []
    for v in versions:
        try:
            repo.verify(v)
        except ShoestringError as e:
            bad.append(v.ref)
            out.print(f"{v.ref}  MISMATCH  {e.where}: {e.what}", highlight=False, soft_wrap=True,
                      markup=False)
        else:
            out.print(f"{v.ref}  ok  sha256 {v.manifest['sha256']}", highlight=False, markup=False)
    _repository_problems(repo)
    bad += sorted(repo.unusable)  # versions no manifest (or a link) let us check
    if bad:
        raise ShoestringError(
            f"{len(bad)} stored version(s) failed the check: {', '.join(bad)}",
            where=str(repo.root),
            fix="push each again from its source (shoestring models push SOURCE --name NAME) "
            "and remove the bad version (shoestring models rm NAME:VERSION --force)")
    out.print(f"{len(versions)} version(s) match their recorded sha256", highlight=False)


@app.command()
def presets(
    vocab: Annotated[int, typer.Option("--vocab", help="Vocabulary size for the counts.")] = 32768,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length for FLOPs/token.")] = 512,
) -> None:
    """List the model presets with parameter counts and training FLOPs per token."""
    import torch

    from shoestring import families
    from shoestring.model import build_model
    from shoestring.model.flops import train_flops_per_token
    from shoestring.model.presets import preset_description, presets

    # Under 120 columns (a pipe, a small terminal) the descriptions go in a second table,
    # so the numbers stay on one line each.
    wide = out.width >= 120
    cols = ("preset", "obj", "shape", "heads", "FFN", "params", "non-emb", "GFLOP/tok")
    t = Table(title=f"model presets (vocabulary {vocab:,}, sequence {seq_len})",
              box=None, pad_edge=False, header_style="bold")
    about = Table(box=None, pad_edge=False, header_style="bold")
    for col in cols + (("for",) if wide else ()):
        t.add_column(col, justify="right" if col in cols[5:] else "left", no_wrap=col != "for")
    about.add_column("preset", no_wrap=True)
    about.add_column("for")
    for name, cfg in presets().items():
        with torch.device("meta"):  # exact counts without allocating the weights
            model = build_model(cfg, vocab)
        fraction = cfg.family.model_head_fraction(cfg, seq_len, families.DEFAULT_MASK_RATE)
        flops = train_flops_per_token(cfg, vocab, seq_len, fraction)
        heads = f"{cfg.num_heads}" + (f"/{cfg.kv_heads}" if cfg.kv_heads != cfg.num_heads else "")
        t.add_row(name, cfg.objective, f"{cfg.num_layers}×{cfg.hidden_size}", heads,
                  f"{cfg.ffn} {cfg.intermediate_size}", f"{model.num_params() / 1e6:,.1f}M",
                  f"{model.num_params(non_embedding=True) / 1e6:,.1f}M", f"{flops / 1e9:,.2f}",
                  *((preset_description(name),) if wide else ()))
        about.add_row(name, preset_description(name))
    out.print(t)
    if not wide:
        out.print()
        out.print(about)
    out.print("shape: layers × hidden; heads: query/key-value heads; FLOPs: training, per token (MLM: the sparse head at "
              "25% of positions). Use one with --set model.preset=NAME (sizes given alongside "
              "it win)")


@app.command()
def plan(
    hardware: Annotated[str, typer.Option("--hardware", help="auto (measure this machine) or a "
                                          "name: h100, a100, rtx4090, mi300x, ... (see docs/planning.md)")] = "auto",
    devices: Annotated[int, typer.Option("--devices", help="Number of accelerators.")] = 1,
    budget: Annotated[str, typer.Option("--budget", "-b", help=f"The budget to plan: {BUDGET_FORMS}.")] = "1h",
    mfu: Annotated[Optional[float], typer.Option("--mfu", help="Fraction of peak a run reaches (default 0.3, device.ASSUMED_MFU).")] = None,
    measure: Annotated[bool, typer.Option("--measure", help="Measure MFU by timing the trainer's own step here.")] = False,
    objective: Annotated[Optional[str], typer.Option("--objective", help="mlm (encoder) or clm (decoder).")] = None,
    law: Annotated[str, typer.Option("--law", help="epoch, chinchilla, or a law file from --fit.")] = "epoch",
    data: Annotated[Optional[Path], typer.Option("--data", "-d", help="Prepared data dir: epochs, seq len, vocab.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the plan (YAML) here.")] = None,
    fit: Annotated[Optional[Path], typer.Option("--fit", help="Fit a law to this sweep dir instead.", metavar="SWEEP_DIR")] = None,
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Spend a share of the budget on an IsoFLOP sweep on --data here, fit the law with intervals, plan the rest with it.")] = False,
    calibrate_share: Annotated[float, typer.Option("--calibrate-share", help="Most of the budget's FLOPs calibration may spend.")] = 0.15,
    calibration_dir: Annotated[Optional[Path], typer.Option("--calibration-dir", help="Where calibration sweeps live (default: next to the data dir), one per data and settings.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Calibration points trained at once, the CPU cores split between them.")] = 1,
    curves: Annotated[bool, typer.Option("--curves", help="Calibrate on learning curves: 5 levels, each size's levels cool-down branches of one constant-LR run (docs/planning.md: not the default, and why).")] = False,
    history: Annotated[Optional[list[Path]], typer.Option("--history", help="Refit with this finished run (evaluated) or sweep dir (repeatable).", metavar="RUN_DIR")] = None,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """How big a model, on how many tokens, for a compute budget (or --fit a law to a sweep)."""
    if fit is not None:
        from shoestring.plan.sweep import fit_sweep, fit_table

        out.print(fit_table(fit_sweep(fit, output)))
        return
    from shoestring.plan.planner import PlanRequest, launch_line, make_plan, plan_table, write_plan

    req = PlanRequest(hardware=hardware, devices=devices, budget=budget, mfu=mfu, measure=measure,
                      objective=objective, law=law, data=str(data) if data else None)
    if calibrate or history:
        from shoestring.plan.calibrate import CalibrationSpec, calibrated_plan

        spec = CalibrationSpec(share=calibrate_share, law=law if law in ("epoch", "chinchilla")
                               else "epoch", overrides=tuple(sets or []), jobs=jobs,
                               branched=curves, levels=5 if curves else 3)
        tree = calibrated_plan(req, spec, calibrate_data=calibrate,
                               history=[str(h) for h in history or []], root=calibration_dir,
                               config=config, console=err)
    else:
        tree = make_plan(req, console=err)
    out.print(plan_table(tree))
    if output is not None:
        out.print(f"wrote {write_plan(tree, output)}; train it with: "
                  f"{launch_line(tree, str(output))}", soft_wrap=True)


@app.command()
def sweep(
    data: Annotated[Path, typer.Option("--data", "-d", help="Data dir written by `shoestring prep`.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Sweep dir (resumable).")],
    budgets: Annotated[str, typer.Option("--budgets", help="FLOP budgets, comma-separated: 1e13,4e13.")],
    sizes: Annotated[str, typer.Option("--sizes", help="Sizes as factors of the law's pick.")] = "0.25,0.5,1,2,4",
    law: Annotated[str, typer.Option("--law", help="Law that centres the sizes.")] = "epoch",
    eval_sequences: Annotated[int, typer.Option("--eval-sequences", min=1, help="Validation sequences per point.")] = 4096,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Points trained at once, the CPU cores split between them.")] = 1,
    curves: Annotated[bool, typer.Option("--curves", help="Learning curves: each size's budgets are cool-down branches of one constant-LR trunk (warmup-stable-decay), so lower budgets cost only their cool-down.")] = False,
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """IsoFLOP sweep: train several sizes to each FLOP budget; `plan --fit` fits the law."""
    from shoestring.plan.sweep import parse_floats, points_table, run_sweep

    points = run_sweep(data, output, parse_floats(budgets, "--budgets"),
                       parse_floats(sizes, "--sizes"), law, config, sets, eval_sequences,
                       console=err, jobs=jobs, branched=curves)
    out.print(points_table(points))
    out.print(f"fit a law to it: shoestring plan --fit {output}")


@app.command()
def report(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Run dirs written by `shoestring train` (overlaid in the plots).",
                       show_default=False, metavar="RUN_DIR..."),
    ],
    output: Annotated[
        Optional[Path],
        typer.Option("--output", "-o", help="Folder to write (default: RUN_DIR/report for one run, "
                     "./report for several)."),
    ] = None,
) -> None:
    """PNG plots (loss vs wall clock, tokens, FLOPs; LR and batch schedules) and one HTML page."""
    from shoestring.report import write_report

    target = output or (runs[0] / "report" if len(runs) == 1 else Path("report"))
    path = write_report(runs, target)
    out.print(f"wrote {path / 'index.html'} ({len(runs)} run(s)) and its plots")


@config_app.command("show")
def config_show(config: ConfigOpt = None, sets: SetOpt = None) -> None:
    """Print the fully resolved configuration as YAML."""
    out.print(_config(config, sets).to_yaml(), end="", markup=False, highlight=False)


def _output_arg(argv: list[str]) -> str | None:
    """The command's ``-o``/``--output`` value: the place to name when a write fails."""
    for i, arg in enumerate(argv):
        if arg in ("-o", "--output") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--output="):
            return arg.split("=", 1)[1]
    return None


def main() -> None:
    """Console entry point: bad input → message on stderr, exit code 2, no traceback."""
    from shoestring.errors import Interrupted, TrainingInterrupted

    try:
        app()
    except ShoestringError as e:
        err.print("[bold red]error:[/] ", end="")
        err.print(e.message, markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except TrainingInterrupted as e:
        err.print(f"{e}: checkpoint saved to {e.checkpoint}; continue with --resume",
                  markup=False, highlight=False)
        sys.exit(128 + e.signum)
    except Interrupted as e:
        import shlex

        err.print(f"{e}: {shlex.join(['shoestring', *sys.argv[1:]])}", markup=False,
                  highlight=False, soft_wrap=True)
        sys.exit(130)
    except BaseException as e:  # a full or read-only disk is the user's, not a bug
        from shoestring.fsutil import output_error

        stop = isinstance(e, (SystemExit, KeyboardInterrupt, GeneratorExit))
        refused = None if stop else output_error(e, where=_output_arg(sys.argv))
        if refused is None:
            raise
        err.print("[bold red]error:[/] ", end="")
        err.print(refused.message, markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
