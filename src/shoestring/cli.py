"""The `shoestring` command: parse the options, resolve them once into objects (the config,
the budget) and dispatch to the command's body (`cli_*` in the package the command belongs to;
`cram`, `report`), which calls the library and prints. Bad input raises ShoestringError anywhere
below: `main` prints its message and exits 2, no traceback; any other exception is a bug."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import typer
from typer.core import TyperArgument, TyperGroup

from shoestring import flags as f
from shoestring.consoles import err, out
from shoestring.errors import ShoestringError
from shoestring.units import parse_budget

if TYPE_CHECKING:
    from shoestring.config import Config


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


@app.callback()
def _root(version: f.Version = False) -> None:
    """shoestring: plan → prep → train → eval on any budget, from a laptop CPU up."""


def _config(config: Path | None, sets: list[str] | None, extra: list[str] | None = None,
            plan: Path | None = None, flags: dict[str, tuple[str, object]] | None = None,
            length: dict[str, tuple[str, object]] | None = None) -> Config:
    """The command's config, built once. ``flags``: option name → (dotted key, value) for the
    options given (None: not given); ``length``: `_length`'s, whose None is meant."""
    from shoestring.config import load_config

    given = {name: kv for name, kv in (flags or {}).items() if kv[1] is not None}
    return load_config(config, [*(extra or []), *(sets or [])], plan=plan,
                       flags={**given, **(length or {})})


def _length(budget: str | None, steps: int | None) -> dict[str, tuple[str, object]]:
    """``--budget`` (parsed here, once, named for its flag) or ``--steps`` as config flags: the
    one given replaces the other, a config file's included."""
    if budget is not None and steps is not None:
        raise ShoestringError(
            "--budget and --steps both say how long to train, and only one can apply",
            where="--steps", fix="pass one of them: --budget 500steps and --steps 500 are the same")
    if budget is not None:
        spec = parse_budget(budget, where="--budget")
        return {"--budget": ("train.budget", spec), "--steps": ("train.steps", None)}
    if steps is not None:
        return {"--steps": ("train.steps", steps), "--budget": ("train.budget", None)}
    return {}


@app.command()
def prep(sources: f.PrepSources, output: f.PrepOutput, config: f.ConfigFile = None,
         sets: f.Set = None, objective: f.PrepObjective = None, tokenizer: f.PrepTokenizer = None,
         text_field: f.PrepTextField = None, split_on: f.PrepSplitOn = None,
         on_error: f.PrepOnError = None, workers: f.PrepWorkers = None,
         filters: f.PrepFilters = None, dedup: f.PrepDedup = None, min_span: f.PrepMinSpan = None,
         canaries: f.PrepCanaries = None, canary_repeats: f.PrepCanaryRepeats = None,
         decontam: f.PrepDecontam = None, dedup_against: f.PrepDedupAgainst = None,
         explain: f.PrepExplain = None, mix: f.PrepMix = None, mix_field: f.PrepMixField = None,
         overwrite: f.PrepOverwrite = False, executor: f.PrepExecutor = "local",
         ray_address: f.PrepRayAddress = None) -> None:
    """Clean, split, train a tokenizer, tokenize and pack SOURCES into a data dir.

    An interrupted prep resumes when re-run with the same inputs and settings.
    """
    from shoestring.prep import cli_prep

    cfg = _config(config, sets, flags={
        "--objective": ("data.objective", objective), "--tokenizer": ("data.tokenizer", tokenizer),
        "--text-field": ("data.text_field", text_field), "--split-on": ("data.split_on", split_on),
        "--on-error": ("data.on_error", on_error), "--workers": ("data.workers", workers),
        "--filters": ("curate.filters", filters), "--dedup": ("curate.dedup", dedup),
        "--explain": ("curate.explain", explain), "--canaries": ("curate.canaries", canaries),
        "--min-span": ("curate.substring_min_span", min_span),
        "--canary-repeats": ("curate.canary_repeats", canary_repeats),
        **cli_prep.mix_flag(mix, mix_field)})
    cli_prep.run(sources, output, cfg, decontam=decontam, dedup_against=dedup_against,
                 overwrite=overwrite, executor=executor, ray_address=ray_address)


@app.command()
def train(data: f.PreparedData, output: f.TrainOutput, budget: f.Budget = None,
          steps: f.Steps = None, config: f.ConfigFile = None, sets: f.Set = None,
          overwrite: f.TrainOverwrite = False, plan: f.TrainPlan = None,
          resume: f.TrainResume = False, init_from: f.TrainInitFrom = None,
          parallel: f.TrainParallel = None, zero: f.TrainZero = None, offload: f.TrainOffload = None,
          ac: f.TrainAc = None, pp_schedule: f.TrainPpSchedule = None,
          microbatches: f.TrainMicrobatches = None) -> None:
    """Pretrain an encoder (masked LM) or decoder (causal LM) on a data dir within a budget."""
    from shoestring import cli_train

    length = _length(budget, steps)
    extra = [f"train.init_from={init_from}"] if init_from is not None else []
    if resume:
        config = cli_train.resumed_config(output, config, plan)
    cfg = _config(config, sets, extra + cli_train.parallel_overrides(parallel), plan=plan, flags={
        "--zero": ("parallel.zero", zero), "--offload": ("parallel.offload", offload),
        "--ac": ("parallel.ac", ac), "--pp-schedule": ("parallel.pp_schedule", pp_schedule),
        "--microbatches": ("parallel.microbatches", microbatches)}, length=length)
    cli_train.run(cfg, data, output, plan=plan, resume=resume, overwrite=overwrite)


@app.command("eval")
def eval_(run: f.TrainedRun, data: f.EvalData = None, sets: f.Set = None, glue: f.EvalGlue = None,
          tasks: f.EvalTasks = None, task: f.EvalTask = None, protocol: f.EvalProtocol = "sane",
          seeds: f.EvalSeeds = "auto", control: f.EvalControl = "scratch",
          output: f.EvalOutput = None, max_train: f.EvalMaxTrain = None,
          precision: f.EvalPrecision = "auto", text: f.EvalText = None,
          choices: f.EvalChoices = None, samples: f.EvalSamples = 3,
          temperature: f.EvalTemperature = 0.0, top_k: f.EvalTopK = None,
          prompt: f.EvalPrompt = None, dp_epsilon: f.EvalDpEpsilon = None,
          dp_delta: f.EvalDpDelta = None, resume: f.EvalResume = False) -> None:
    """Evaluate a run: held-out MLM loss, fine-tuning on GLUE / own tasks, or decoder evals."""
    options = dict(locals())  # every option, by its flag's name: run_eval's own names
    from shoestring.cli_eval import run_eval

    run_eval(**options)


@app.command()
def audit(run: f.TrainedRun, data: f.AuditData, candidates: f.AuditCandidates = 1000,
          sequences: f.AuditSequences = 256, extract: f.AuditExtract = 64) -> None:
    """Memorization audit: canary exposure, membership inference AUC, extraction (docs/privacy.md)."""
    from shoestring.privacy.audit import AuditSettings, print_audit

    print_audit(run, data, AuditSettings(candidates=candidates, sequences=sequences,
                                         extract=extract))


@app.command()
def export(run: f.TrainedRun, output: f.ExportOutput, overwrite: f.ExportOverwrite = False,
           fmt: f.ExportFmt = "hf") -> None:
    """Export a trained run in Hugging Face format (encoders as ModernBERT, decoders as Llama),
    or an encoder's or classifier's forward pass as ONNX (--format onnx)."""
    from shoestring.inference import cli_export

    cli_export.run(run, output, overwrite=overwrite, fmt=fmt)


@app.command()
def cram(sources: f.CramSources = None, output: f.CramOutput = Path("runs/cram"),
         budget: f.Budget = None, steps: f.Steps = None, config: f.ConfigFile = None,
         sets: f.Set = None, eval_task: f.CramEvalTask = None, auto: f.CramAuto = False,
         calibrate_share: f.CramCalibrateShare = 0.15, jobs: f.CramJobs = 1,
         objective: f.CramObjective = None) -> None:
    """Everything on the built-in corpus: prep → train (3 minutes) → eval → results table."""
    from shoestring import cram as cram_

    cfg = _config(config, sets, length=_length(budget, steps),
                  flags={"--objective": ("model.objective", objective)})
    cram_.run(sources, output, cfg, eval_task=eval_task, auto=auto,
              calibrate_share=calibrate_share, sets=sets, jobs=jobs)


@app.command()
def serve(models: f.ServeModels, host: f.ServeHost = "127.0.0.1", port: f.ServePort = 8000,
          max_batch_tokens: f.ServeMaxBatchTokens = 16384,
          max_batch_size: f.ServeMaxBatchSize = None, max_wait_ms: f.ServeMaxWaitMs = 0.0,
          max_queue: f.ServeMaxQueue = 4096,
          max_concurrent_requests: f.ServeMaxConcurrentRequests = 512,
          max_length: f.ServeMaxLength = None, truncate: f.ServeTruncate = False,
          max_client_batch: f.ServeMaxClientBatch = 1024,
          max_body_bytes: f.ServeMaxBodyBytes = 1 << 20, max_new_tokens: f.ServeMaxNewTokens = 256,
          request_timeout: f.ServeRequestTimeout = 30.0, body_timeout: f.ServeBodyTimeout = 15.0,
          shutdown_timeout: f.ServeShutdownTimeout = 30.0, idle_timeout: f.ServeIdleTimeout = 30.0,
          max_connections: f.ServeMaxConnections = 4096,
          max_header_bytes: f.ServeMaxHeaderBytes = 16384, api_key: f.ServeApiKey = None,
          precision: f.ServePrecision = "fp32", threads: f.ServeThreads = None,
          index: f.ServeIndex = None, workers: f.ServeWorkers = 1,
          backend: f.ServeBackend = "auto") -> None:
    """Serve trained models over HTTP with token-budget batching (docs/serving.md)."""
    options = dict(locals())  # every option, by its flag's name: the settings' own names
    from shoestring.serve.server import serve_command

    serve_command(**options)


@app.command()
def index(sources: f.IndexSources, output: f.IndexOutput, encoder: f.IndexEncoder = None,
          passage_words: f.IndexPassageWords = 100, text_field: f.IndexTextField = "text",
          split_on: f.IndexSplitOn = "blank", overwrite: f.IndexOverwrite = False) -> None:
    """Split documents into passages and index them: BM25, plus dense vectors with --encoder
    (docs/retrieval.md). Re-running with unchanged sources only redoes what changed."""
    from shoestring.retrieval import cli_retrieval

    cli_retrieval.index(sources, output, encoder=encoder, passage_words=passage_words,
                        text_field=text_field, split_on=split_on, overwrite=overwrite)


@app.command()
def search(index_dir: f.SearchIndexDir, query: f.SearchQuery, k: f.SearchK = 5,
           mode: f.Mode = "hybrid", encoder: f.SearchEncoder = None,
           as_json: f.SearchAsJson = False) -> None:
    """Search an index: the k best passages for QUERY, with their sources."""
    from shoestring.retrieval import cli_retrieval

    cli_retrieval.search(index_dir, query, k=k, mode=mode, encoder=encoder, as_json=as_json)


@app.command()
def ask(run: f.AskRun, question: f.AskQuestion, index_dir: f.AskIndexDir, k: f.AskK = 5,
        mode: f.Mode = "hybrid", encoder: f.AskEncoder = None,
        max_new_tokens: f.AskMaxNewTokens = 64, temperature: f.AskTemperature = 0.0,
        top_k: f.AskTopK = None, seed: f.AskSeed = 0) -> None:
    """Answer QUESTION with the decoder, its context holding the passages retrieved for it."""
    from shoestring.retrieval import cli_retrieval

    cli_retrieval.ask(run, question, index_dir=index_dir, k=k, mode=mode, encoder=encoder,
                      max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                      seed=seed)


models_app = typer.Typer(help="The model repository ($SHOESTRING_HOME/models): push, list, tag, "
                         "rm, verify.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("push")
def models_push(source: f.ModelPushSource, name: f.ModelPushName) -> None:
    """Store a model as the next version of NAME (identical content is stored once)."""
    from shoestring import cli_models

    cli_models.push(source, name)


@models_app.command("list")
def models_list(name: f.ModelListName = None) -> None:
    """The stored models and versions with their tags and eval metrics (and any repository
    file that is unreadable or holds bad entries, which are skipped)."""
    from shoestring import cli_models

    cli_models.list_versions(name)


@models_app.command("tag")
def models_tag(ref: f.ModelTagRef, tag: f.ModelTagTag) -> None:
    """Point a tag at a version; servers serving NAME:TAG follow it without a restart."""
    from shoestring import cli_models

    cli_models.tag(ref, tag)


@models_app.command("rm")
def models_rm(ref: f.ModelRmRef, force: f.ModelRmForce = False) -> None:
    """Remove a model, or one of its versions (a tagged one only with --force)."""
    from shoestring import cli_models

    cli_models.remove(ref, force)


@models_app.command("verify")
def models_verify(ref: f.ModelVerifyRef = None) -> None:
    """Check stored versions' files against the sha256 recorded at push (exit 2 on a mismatch
    or an unusable manifest)."""
    from shoestring import cli_models

    cli_models.verify(ref)


@app.command()
def presets(vocab: f.PresetsVocab = 32768, seq_len: f.PresetsSeqLen = 512) -> None:
    """List the model presets with parameter counts and training FLOPs per token."""
    from shoestring.model.presets import print_presets

    print_presets(vocab, seq_len)


@app.command()
def plan(hardware: f.PlanHardware = "auto", devices: f.PlanDevices = 1, budget: f.PlanBudget = "1h",
         mfu: f.PlanMfu = None, measure: f.PlanMeasure = False, objective: f.PlanObjective = None,
         law: f.PlanLaw = "epoch", data: f.PlanData = None, output: f.PlanOutput = None,
         fit: f.PlanFit = None, calibrate: f.PlanCalibrate = False,
         calibrate_share: f.PlanCalibrateShare = 0.15, calibration_dir: f.PlanCalibrationDir = None,
         jobs: f.PlanJobs = 1, curves: f.PlanCurves = False, history: f.PlanHistory = None,
         config: f.ConfigFile = None, sets: f.Set = None) -> None:
    """How big a model, on how many tokens, for a compute budget (or --fit a law to a sweep)."""
    from shoestring.plan import cli_plan

    if fit is not None:
        cli_plan.fit(fit, output)
        return
    cli_plan.plan(parse_budget(budget, where="--budget"), hardware=hardware, devices=devices,
                  mfu=mfu, measure=measure, objective=objective, law=law, data=data,
                  output=output, calibrate=calibrate, calibrate_share=calibrate_share,
                  calibration_dir=calibration_dir, jobs=jobs, curves=curves, history=history,
                  config=config, sets=sets)


@app.command()
def sweep(data: f.PreparedData, output: f.SweepOutput, budgets: f.SweepBudgets,
          sizes: f.SweepSizes = "0.25,0.5,1,2,4", law: f.SweepLaw = "epoch",
          eval_sequences: f.SweepEvalSequences = 4096, jobs: f.SweepJobs = 1,
          curves: f.SweepCurves = False, config: f.ConfigFile = None, sets: f.Set = None) -> None:
    """IsoFLOP sweep: train several sizes to each FLOP budget; `plan --fit` fits the law."""
    from shoestring.plan import cli_plan

    cli_plan.sweep(data, output, budgets=budgets, sizes=sizes, law=law,
                   eval_sequences=eval_sequences, jobs=jobs, curves=curves, config=config,
                   sets=sets)


@app.command()
def report(runs: f.ReportRuns, output: f.ReportOutput = None) -> None:
    """PNG plots (loss vs wall clock, tokens, FLOPs; LR and batch schedules) and one HTML page."""
    from shoestring.report import write_report

    path = write_report(runs, output or (runs[0] / "report" if len(runs) == 1 else Path("report")))
    out.print(f"wrote {path / 'index.html'} ({len(runs)} run(s)) and its plots")


@config_app.command("show")
def config_show(config: f.ConfigFile = None, sets: f.Set = None) -> None:
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
