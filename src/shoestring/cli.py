"""The `shoestring` command. Subcommands are thin: parse, call the library, print.

Bad input raises ShoestringError anywhere below; `main` prints its message and exits 2 with
no traceback. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from shoestring import __version__
from shoestring.errors import ShoestringError

app = typer.Typer(
    name="shoestring",
    help="Train the best language model a compute budget allows: "
    "prep raw text, pretrain within a budget, evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

out = Console()
err = Console(stderr=True)

ConfigOpt = Annotated[
    Optional[Path], typer.Option("--config", "-c", help="YAML file with data/model/train/eval sections.")
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override one setting: section.key=value (repeatable).", metavar="KEY=VALUE"),
]
BudgetOpt = Annotated[
    Optional[str], typer.Option("--budget", "-b", help="Wall-clock budget for training: 90s, 5m, 2h.")
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


def _config(config: Path | None, sets: list[str] | None, extra: list[str] | None = None):
    from shoestring.config import load_config

    return load_config(config, [*(extra or []), *(sets or [])])


def _budget_overrides(budget: str | None, steps: int | None) -> list[str]:
    from shoestring.train.budget import parse_duration

    extra = []
    if budget is not None:
        try:
            parse_duration(budget)
        except ShoestringError as e:
            raise ShoestringError(e.what, where="--budget", fix=e.fix) from None
        extra += [f"train.budget={budget}", "train.steps=null"]
    if steps is not None:
        extra += [f"train.steps={steps}", "train.budget=null"]
    return extra


@app.command()
def prep(
    sources: Annotated[
        list[str],
        typer.Argument(
            help="Files (.txt, .jsonl), folders, globs, or builtin:pydocs.",
            show_default=False,
            metavar="SOURCES",
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Data dir to write.")],
    config: ConfigOpt = None,
    sets: SetOpt = None,
) -> None:
    """Clean, split, train a tokenizer, tokenize and pack SOURCES into a data dir."""
    from shoestring.data.prep import prep as run_prep

    cfg = _config(config, sets)
    manifest = run_prep(sources, output, cfg.data, console=err)
    _print_prep(manifest, output)


def _print_prep(manifest: dict, output: Path) -> None:
    docs, splits = manifest["documents"], manifest["splits"]
    t = Table(title=f"prepared {output}", show_header=False)
    t.add_row("documents read", f"{docs['read']:,}")
    if docs["skipped_bad_input"]:
        t.add_row("skipped (bad input)", f"{docs['skipped_bad_input']:,}")
    t.add_row("dropped (too short)", f"{docs['dropped_too_short']:,}")
    t.add_row("kept (train / val)", f"{docs['kept']:,} ({docs['train']:,} / {docs['val']:,})")
    t.add_row("vocabulary", f"{manifest['tokenizer']['vocab_size']:,} WordPiece")
    for name in ("train", "val"):
        s = splits[name]
        t.add_row(f"{name} sequences × {manifest['seq_len']}", f"{s['sequences']:,} ({s['tokens']:,} tokens)")
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
) -> None:
    """Pretrain a BERT-style encoder (masked LM) on a data dir within a budget."""
    from shoestring.train.loop import train as run_train

    cfg = _config(config, sets, _budget_overrides(budget, steps))
    summary = run_train(cfg, data, output, overwrite=overwrite, console=err)
    _print_train(summary, output)


def _print_train(summary: dict, output: Path) -> None:
    t = Table(title=f"trained {output}", show_header=False)
    t.add_row("steps / tokens", f"{summary['steps']:,} / {summary['tokens']:,}")
    t.add_row("time", f"{summary['train_seconds']:.1f}s (+{summary['save_seconds']:.1f}s save)")
    t.add_row("tokens/s", f"{summary['tokens_per_s']:,.0f}")
    t.add_row("MFU", f"{summary['mfu']:.1%} of {summary['peak_flops'] / 1e9:,.0f} GFLOP/s measured ({summary['dtype']})")
    t.add_row("train loss", f"{summary['first_loss']:.3f} → {summary['final_train_loss']:.3f}")
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
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Fine-tuning seeds per task (median and spread).")] = 3,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output folder (default: RUN_DIR/downstream).")] = None,
    max_train: Annotated[Optional[int], typer.Option("--max-train", min=1, help="Use only the first N training examples (a quick look, not the protocol).")] = None,
    precision: Annotated[str, typer.Option("--precision", help="auto, bf16 or fp32.")] = "auto",
    text: Annotated[Optional[Path], typer.Option("--text", help="Decoders: held-out .txt/.jsonl for perplexity (default: the run's val split).")] = None,
    choices: Annotated[Optional[Path], typer.Option("--choices", help="Decoders: JSONL of context/choices/answer, scored zero-shot.")] = None,
    samples: Annotated[int, typer.Option("--samples", min=0, help="Decoders: greedy samples to show.")] = 3,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="Decoders: prompt for samples (repeatable).")] = None,
) -> None:
    """Evaluate a run: held-out MLM loss, fine-tuning on GLUE / own tasks, or decoder evals."""
    from shoestring.eval.cli_helpers import run_eval

    run_eval(run, data=data, sets=sets, glue=glue, tasks=tasks, task=task, protocol=protocol,
             seeds=seeds, output=output, max_train=max_train, precision=precision, text=text,
             choices=choices, samples=samples, prompt=prompt, out=out, err=err,
             print_mlm=_print_eval)


def _print_eval(result: dict, run: Path) -> None:
    t = Table(title=f"evaluated {run}", show_header=False)
    t.add_row("validation MLM loss", f"{result['mlm_loss']:.3f} (perplexity {result['perplexity']:.1f}, "
              f"{result['mask_rate']:.0%} masked)")
    t.add_row("unigram baseline", f"{result['unigram_loss']:.3f}")
    t.add_row("masked-token accuracy", f"{result['accuracy']:.1%}")
    t.add_row("scored", f"{result['masked_tokens']:,} masked tokens in {result['sequences']:,} sequences")
    out.print(t)


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="Run dir written by `shoestring train`.", show_default=False, metavar="RUN_DIR")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write (Hugging Face format).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a previous export.")] = False,
) -> None:
    """Export a trained run in Hugging Face format: encoders as ModernBERT, decoders as Llama."""
    from shoestring.model.hub import export_run

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
    auto = "AutoModelForCausalLM" if cfg["model_type"] == "llama" else "AutoModelForMaskedLM"
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
) -> None:
    """Everything on the built-in corpus: prep → train (3 minutes) → eval → results table."""
    from shoestring.cram import cram as run_cram

    cfg = _config(config, sets, _budget_overrides(budget, steps))
    result = run_cram(sources or ["builtin:pydocs"], output, cfg, console=err)
    out.print(result.table())


@app.command()
def serve(
    model: Annotated[
        Path,
        typer.Argument(help="Run dir, `shoestring export` folder, or fine-tuned classifier folder.",
                       show_default=False, metavar="RUN_DIR|HF_DIR"),
    ],
    host: Annotated[str, typer.Option(help="Address to listen on (loopback: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port (0: any free port, printed at start).")] = 8000,
    max_batch_size: Annotated[int, typer.Option(help="Inputs per model call at most.")] = 32,
    max_wait_ms: Annotated[float, typer.Option(help="How long the oldest input waits for batch-mates.")] = 5.0,
    max_queue: Annotated[int, typer.Option(help="Queued inputs before answering 503 + Retry-After.")] = 1024,
    max_length: Annotated[int, typer.Option(help="Tokens per input, special tokens included.")] = 512,
    truncate: Annotated[
        bool, typer.Option("--truncate/--reject", help="Over-long input: cut it to --max-length, or answer 422.")
    ] = False,
    max_inputs: Annotated[int, typer.Option(help="Texts in one request at most.")] = 64,
    max_body_bytes: Annotated[int, typer.Option(help="Request body size limit (413 above it).")] = 1 << 20,
    max_new_tokens: Annotated[int, typer.Option(help="Generation: the most new tokens one request may ask.")] = 256,
    request_timeout: Annotated[float, typer.Option(help="Seconds before an unanswered request gets 504.")] = 30.0,
    shutdown_timeout: Annotated[float, typer.Option(help="On Ctrl-C/SIGTERM, seconds to let in-flight requests finish.")] = 30.0,
    api_key: Annotated[
        Optional[str],
        typer.Option(envvar="SHOESTRING_API_KEY", show_envvar=True,
                     help="Require this key on /v1 and /metrics (Authorization: Bearer KEY or X-API-Key). "
                     "Prefer the environment variable: options show in the process list."),
    ] = None,
    precision: Annotated[str, typer.Option(help="fp32, bf16 (autocast), or auto (bf16 where faster).")] = "fp32",
) -> None:
    """Serve a trained model over HTTP with dynamic micro-batching (docs/serving.md)."""
    from shoestring.serve.server import serve as run_serve
    from shoestring.serve.settings import make_settings

    settings = make_settings(
        host=host, port=port, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
        max_queue=max_queue, max_length=max_length, truncate=truncate, max_inputs=max_inputs,
        max_body_bytes=max_body_bytes, max_new_tokens=max_new_tokens,
        request_timeout_s=request_timeout, shutdown_timeout_s=shutdown_timeout, api_key=api_key,
        precision=precision,
    )
    if not settings.loopback and settings.api_key is None:
        err.print(f"[yellow]warning:[/] listening on {host} without --api-key: anyone who can "
                  "reach this machine can use the model")
    run_serve(model, settings, announce=lambda msg: err.print(msg, markup=False, highlight=False))


@app.command()
def models(
    vocab: Annotated[int, typer.Option("--vocab", help="Vocabulary size for the counts.")] = 32768,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length for FLOPs/token.")] = 512,
) -> None:
    """List the model presets with parameter counts and training FLOPs per token."""
    import torch

    from shoestring.model import build_model
    from shoestring.model.flops import train_flops_per_token
    from shoestring.model.presets import preset_description, presets

    t = Table(title=f"model presets (vocabulary {vocab:,}, sequence {seq_len})")
    for col in ("preset", "objective", "layers × hidden", "heads", "FFN", "params",
                "non-embedding", "train FLOPs/token", "for"):
        t.add_column(col, justify="right" if col in ("params", "non-embedding", "train FLOPs/token") else "left")
    for name, cfg in presets().items():
        with torch.device("meta"):  # exact counts without allocating the weights
            model = build_model(cfg, vocab)
        fraction = 0.25 if cfg.objective == "mlm" and cfg.sparse_prediction else 1.0
        flops = train_flops_per_token(cfg, vocab, seq_len, fraction)
        heads = f"{cfg.num_heads}" + (f" (kv {cfg.kv_heads})" if cfg.kv_heads != cfg.num_heads else "")
        t.add_row(name, cfg.objective, f"{cfg.num_layers} × {cfg.hidden_size}", heads,
                  f"{cfg.ffn} {cfg.intermediate_size}", f"{model.num_params() / 1e6:,.1f}M",
                  f"{model.num_params(non_embedding=True) / 1e6:,.1f}M", f"{flops / 1e9:,.2f} G",
                  preset_description(name))
    out.print(t)
    out.print("use one with --set model.preset=NAME (sizes given alongside it win); "
              "MLM FLOPs assume the sparse head at 25% of positions")


@config_app.command("show")
def config_show(config: ConfigOpt = None, sets: SetOpt = None) -> None:
    """Print the fully resolved configuration as YAML."""
    out.print(_config(config, sets).to_yaml(), end="", markup=False, highlight=False)


def main() -> None:
    """Console entry point: bad input → message on stderr, exit code 2, no traceback."""
    try:
        app()
    except ShoestringError as e:
        err.print("[bold red]error:[/] ", end="")
        err.print(e.message, markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
