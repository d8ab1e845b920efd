"""The body of `shoestring eval`: pick the evaluation the flags ask for and print its table.

- ``--glue`` / ``--tasks`` / ``--task``: fine-tune on tasks (eval/downstream.py);
- a decoder run, or ``--text`` / ``--choices`` / ``--prompt``: decoder evals (eval/causal_lm.py);
- otherwise: the held-out masked-LM loss (eval/mlm_loss.py), as before.

It sits on the command line's floor, not in ``eval/``, because it also asks ``plan`` whether the
run met its prediction, and ``plan`` (its sweeps) reads ``eval``'s held-out loss: inside
``eval`` that made a package circle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from shoestring.consoles import err, out
from shoestring.errors import ShoestringError
from shoestring.plan.prediction import check_run, describe
from shoestring.rundir import RunDir


def run_eval(run: Path, *, data: Path | None, sets: list[str] | None, glue: str | None,
             tasks: str | None, task: list[str] | None, protocol: str, seeds: str, control: str,
             output: Path | None, max_train: int | None, precision: str, text: Path | None,
             choices: Path | None, samples: int, prompt: list[str] | None,
             dp_epsilon: float | None = None, dp_delta: float | None = None,
             resume: bool = False, temperature: float = 0.0, top_k: int | None = None) -> None:
    """`shoestring eval`'s options → the evaluation they ask for (module docstring), printed."""
    privacy = None
    if dp_epsilon is not None or dp_delta is not None or any(
            s.startswith("eval.dp_") for s in sets or []):
        from shoestring.privacy.dp_sgd import PrivateTraining

        privacy = PrivateTraining.from_options(None, sets, dp_epsilon, dp_delta)
        if privacy is None:
            raise ShoestringError("--dp-delta without --dp-epsilon", where="--dp-delta",
                                  fix="add --dp-epsilon (e.g. 8)")
    if precision not in ("auto", "bf16", "fp32"):
        raise ShoestringError(f"unknown precision {precision!r}", where="--precision",
                              fix="choose auto, bf16 or fp32")
    seed_count = parse_seeds(seeds)
    from shoestring.artifacts import Kind, identify

    identify(run, want=(Kind.RUN,), command="shoestring eval", trained=True)
    downstream = glue is not None or tasks is not None or bool(task)
    decoder_flags = text is not None or choices is not None or bool(prompt)
    if resume and not downstream:
        raise ShoestringError("--resume applies to fine-tuning", where="--resume",
                              fix="add --glue/--tasks/--task, or drop --resume")
    if privacy is not None and not downstream:
        raise ShoestringError("DP-SGD applies to fine-tuning", where="--dp-epsilon",
                              fix="add --glue/--tasks/--task")
    if downstream:
        if decoder_flags:
            raise ShoestringError(
                "--text/--choices/--prompt are decoder evals; --glue/--tasks/--task fine-tune "
                "an encoder", where="shoestring eval", fix="run them separately")
        from shoestring.eval.downstream import evaluate_downstream
        from shoestring.eval.tasks import parse_task_arg

        custom = [parse_task_arg(t) for t in task or []]
        results = evaluate_downstream(run, glue=glue, tasks=tasks, custom=custom,
                                      protocol=protocol, seeds=seed_count, control=control,
                                      out=output, max_train=max_train, precision=precision,
                                      console=err, privacy=privacy, resume=resume)
        print_downstream(results, output or RunDir(run).downstream_dir)
        return
    family = RunDir(run).family()  # None: load_final reports a missing or damaged run
    if decoder_flags or (family is not None and family.causal):
        from shoestring.eval.causal_lm import evaluate_decoder

        result = evaluate_decoder(run, text=text, choices=choices, samples=samples, prompts=prompt,
                                  temperature=temperature, top_k=top_k, precision=precision,
                                  out=output, console=err)
        print_decoder(result)
        return
    from shoestring.eval.mlm_loss import evaluate_run

    print_mlm(evaluate_run(run, data, overrides=sets, console=err), run)


def parse_seeds(text: str) -> int | None:
    """``--seeds``: a count of at least 1, or ``auto`` (None: the rule in eval/control.py)."""
    if text.strip().lower() == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ShoestringError(f"--seeds must be a whole number of at least 1, or auto; got {text!r}",
                              where="--seeds", fix="e.g. --seeds 5, or --seeds auto")
    return n


def print_downstream(results: dict[str, Any], folder: Path) -> None:
    from shoestring.eval.downstream_report import fmt_difference

    t = Table(title=f"fine-tuned {results['run']} ({results['protocol']['name']} protocol)")
    controlled = any("scratch" in c for c in results["columns"])
    for name in ("task", "split", "metric", "seeds"):
        t.add_column(name)
    scratch = ["scratch median", "pretrained − scratch [95% CI]"] if controlled else []
    for name in ["median ×100", "min–max", *scratch, "s/seed"]:
        t.add_column(name, justify="right")
    for c in results["columns"]:
        res = results["tasks"][c["task"]]
        secs = sum(s["train_seconds"] + s["eval_seconds"] for s in res["seeds"]) / len(res["seeds"])
        row = [c["column"], c["split"], c["metric"], str(c["seeds"]), f"{c['median']:.1f}",
               f"{c['min']:.1f}–{c['max']:.1f}"]
        if controlled:
            row += [f"{c['scratch']['median']:.1f}", fmt_difference(c["comparison"])] \
                if "scratch" in c else ["–", "–"]
        t.add_row(*row, f"{secs:.0f}")
    out.print(t)
    if "privacy" in results:
        spent = [s["privacy"]["epsilon_spent"] for r in results["tasks"].values()
                 for s in r["seeds"]]
        p = results["privacy"]
        out.print(f"DP-SGD: ε spent {max(spent):.2f} (target {p['target_epsilon']:g}, "
                  f"δ {p['delta']:g}) per run — private: the fine-tuning examples only")
    avg = results["glue_average"] or {}
    if avg.get("complete"):
        out.print(f"GLUE average {avg['glue9']:.1f} (glue9: {avg['conventions']['glue9']}); "
                  f"glue8 {avg['glue8']:.1f}")
    elif avg.get("partial_mean") is not None:
        out.print(f"partial mean {avg['partial_mean']:.1f}: {avg['partial_note']}")
    for c in results["columns"]:
        if "comparison" in c:
            out.print(f"{c['column']}: {c['comparison']['verdict']}")
    out.print(f"report: {folder}/results.md, results.json, results.png; "
              f"classifiers in {folder}/classifiers/ (wall {results['wall_seconds']:.0f}s)")


def print_decoder(result: dict[str, Any]) -> None:
    t = Table(title=f"evaluated {result['run']} (decoder)", show_header=False)
    p = result["perplexity"]
    line = f"{p['loss']:.3f} nats/token, perplexity {p['perplexity']:.1f} ({p['tokens']:,} tokens)"
    if p.get("bits_per_byte") is not None:
        line += f", {p['bits_per_byte']:.3f} bits/byte"
    t.add_row(f"held-out loss ({p['source']})", line)
    if "multiple_choice" in result:
        m = result["multiple_choice"]
        t.add_row("multiple choice", f"accuracy {m['accuracy']:.1%}, per-character normalized "
                  f"{m['accuracy_norm']:.1%} (chance {m['chance']:.1%}, {m['items']} items)")
    if result.get("samples"):
        t.add_row("samples decoded", result["samples_decoding"])
    for s in result.get("samples", []):
        t.add_row(f"sample: {s['prompt']!r}", s["continuation"].replace("\n", " ⏎ "))
    if (checked := check_run(result["run"], result)) is not None:
        t.add_row("plan's prediction", describe(checked))
    out.print(t)
    out.print(f"written: {result['written']}")


def print_mlm(result: dict[str, Any], run: Path) -> None:
    from shoestring.eval.mlm_loss import detection_rows

    t = Table(title=f"evaluated {run}", show_header=False)
    t.add_row("validation MLM loss", f"{result['mlm_loss']:.3f} (perplexity {result['perplexity']:.1f}, "
              f"{result['mask_rate']:.0%} masked)")
    gap = result["mlm_loss"] - result["unigram_loss"]
    t.add_row("unigram baseline", f"{result['unigram_loss']:.3f} (guessing every masked token "
              "by its frequency)" + (f": the model is {gap:.3f} worse — it has not yet learned "
                                     "more than token frequencies; train longer" if gap > 0
                                     else f": the model is {-gap:.3f} better"))
    t.add_row("masked-token accuracy", f"{result['accuracy']:.1%}")
    for row in detection_rows(result):
        t.add_row(*row)
    t.add_row("scored", f"{result['masked_tokens']:,} masked tokens in {result['sequences']:,} sequences")
    if (checked := check_run(run, result)) is not None:
        t.add_row("plan's prediction", describe(checked))
    out.print(t)
