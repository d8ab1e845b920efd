"""Held-out masked-LM loss, beside the unigram baseline.

The baseline is the cross-entropy of a model that knows only the training-token frequencies,
scored on exactly the same masked positions: how far below it the model gets is how much it
learned from context. The masking is drawn from a fixed seed, so two runs evaluated on the
same data dir are scored on the same positions.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from shoestring.config import EvalConfig, load_config
from shoestring.data.datadir import DataDir
from shoestring.data.masking import mask_tokens
from shoestring.data.tokenizer import MASK, NUM_SPECIAL
from shoestring.errors import ShoestringError
from shoestring.model.encoder import MaskedLM
from shoestring.progress import progress_bar
from shoestring.train.device import select_device
from shoestring.train.rundir import load_final, write_json_atomic


@torch.no_grad()
def evaluate_mlm(
    model: MaskedLM,
    data: DataDir,
    cfg: EvalConfig,
    mask_rate: float,
    precision: str = "auto",
    console: Console | None = None,
) -> dict:
    """Masked-token cross-entropy, accuracy and the unigram baseline on the val split."""
    console = console or Console(stderr=True)
    dev = select_device(precision)
    model = model.to(dev.device).eval()
    val = data.split("val", verify=True)
    unigram = torch.from_numpy(data.unigram_logprobs()).to(dev.device)
    n = min(len(val), cfg.max_sequences)
    gen = torch.Generator(device=dev.device).manual_seed(cfg.seed)
    mask_id, vocab = data.special_ids[MASK], data.vocab_size
    total_nll = total_uni = 0.0
    correct = count = 0
    with progress_bar(console) as bar:
        task = bar.add_task("evaluating", total=n, unit="seqs")
        for start in range(0, n, cfg.batch_size):
            idx = np.arange(start, min(start + cfg.batch_size, n))
            ids = torch.from_numpy(val.take(idx)).to(dev.device)
            batch = mask_tokens(ids, mask_rate, NUM_SPECIAL, mask_id, vocab, gen)
            with dev.autocast():
                logits = model(batch.inputs, batch.positions)
            logits = logits.float().flatten(0, 1)
            targets = batch.targets.flatten()
            total_nll += F.cross_entropy(logits, targets, reduction="sum").item()
            total_uni += -unigram[targets].sum().item()
            correct += (logits.argmax(-1) == targets).sum().item()
            count += targets.numel()
            bar.update(task, advance=len(idx))
    loss = total_nll / count
    return {
        "mlm_loss": loss,
        "perplexity": float(np.exp(loss)),
        "accuracy": correct / count,
        "unigram_loss": total_uni / count,
        "sequences": int(n),
        "masked_tokens": int(count),
    }


def evaluate_run(
    run_dir: str | Path, data_dir: str | Path | None = None, console: Console | None = None
) -> dict:
    """Evaluate a finished run on its data dir's val split (or another data dir with the same
    tokenizer); writes ``eval.json`` in the run dir and returns it."""
    run_dir = Path(run_dir)
    model, meta = load_final(run_dir)
    cfg = load_config(run_dir / "config.yaml")
    summary_path = run_dir / "summary.json"
    if data_dir is None:
        if not summary_path.is_file():
            raise ShoestringError(
                "the run has no summary.json naming its data dir", where=str(run_dir),
                fix="pass --data DATA_DIR",
            )
        data_dir = json.loads(summary_path.read_text(encoding="utf-8"))["data_dir"]
    data = DataDir(data_dir)
    if data.vocab_size != meta["vocab_size"] or data.special_ids != meta["special_ids"]:
        raise ShoestringError(
            "this data dir was tokenized with a different tokenizer than the model's",
            where=str(data_dir),
            fix="evaluate on data prepared with the run's tokenizer",
        )
    mask_rate = cfg.eval.mask_rate or cfg.train.mask_rate
    result = evaluate_mlm(model, data, cfg.eval, mask_rate, cfg.train.precision, console)
    result |= {"data_dir": str(Path(data_dir).resolve()), "mask_rate": mask_rate}
    write_json_atomic(run_dir / "eval.json", result)
    return result
