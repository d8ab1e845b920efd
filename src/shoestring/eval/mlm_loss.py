"""Held-out masked-LM loss, beside the unigram baseline.

The baseline is the cross-entropy of a model that knows only the training-token frequencies,
scored on exactly the same masked positions: how far below it the model gets is how much it
learned from context.

Masks are drawn on the CPU from (``eval.seed``, sequence index) at a fixed rate
(``eval.mask_rate``, 0.25 by default, whatever rate the run trained with), so every model
evaluated on the same data dir is scored on the same positions and targets, whatever the
batch size or device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console

from shoestring.config import EvalConfig
from shoestring.data.datadir import DataDir
from shoestring.data.masking import fixed_masks, fixed_uniforms
from shoestring.families.spec import MASK, NUM_SPECIAL
from shoestring.device import select_device
from shoestring.errors import ShoestringError
from shoestring.model.losses import masked_lm_loss
from shoestring.fsutil import file_sha256, write_json_atomic
from shoestring.model.encoder import MaskedLM
from shoestring.model.detector import ReplacedTokenDetector
from shoestring.progress import progress_bar
from shoestring.rundir import RunDir


@torch.no_grad()
def evaluate_mlm(
    model: MaskedLM | ReplacedTokenDetector,
    data: DataDir,
    cfg: EvalConfig,
    precision: str = "auto",
    console: Console | None = None,
) -> dict:
    """Masked-token cross-entropy, accuracy and the unigram baseline on the val split; for
    an RTD model the generator's, and the discriminator's scores on the generator's
    replacements (``DetectionScore``)."""
    console = console or Console(stderr=True)
    dev = select_device(precision, measure_peak=False)
    model = model.to(dev.device).eval()
    val = data.split("val", verify=True)
    unigram = torch.from_numpy(data.unigram_logprobs())
    n = min(len(val), cfg.max_sequences)
    mask_id, vocab = data.special_ids[MASK], data.vocab_size
    total_nll = total_uni = 0.0
    correct = count = 0
    detector = DetectionScore() if isinstance(model, ReplacedTokenDetector) else None
    with progress_bar(console) as bar:
        task = bar.add_task("evaluating", total=n, unit="seqs")
        for start in range(0, n, cfg.batch_size):
            ids = torch.from_numpy(val.take(np.arange(start, min(start + cfg.batch_size, n))))
            batch = fixed_masks(ids, start, cfg.mask_rate, cfg.seed, NUM_SPECIAL, mask_id, vocab)
            inputs, positions = batch.inputs.to(dev.device), batch.positions.to(dev.device)
            with dev.autocast():
                if detector is None:
                    logits = model(inputs, positions)
                else:  # the generator's MLM, and the discriminator on its replacements
                    uniforms = fixed_uniforms(batch.positions, start, cfg.seed)
                    logits, disc, replaced = model(inputs, positions,
                                                   batch.targets.to(dev.device),
                                                   uniforms.to(dev.device))
                    detector.add(disc.float().cpu(), replaced.cpu())
            logits = logits.float().cpu()
            targets = batch.targets
            total_nll += masked_lm_loss(logits, targets, reduction="sum").item()
            total_uni += -unigram[targets].sum().item()
            correct += (logits.argmax(-1) == targets).sum().item()
            count += targets.numel()
            bar.update(task, advance=len(ids))
    loss = total_nll / count
    return {
        **({} if detector is None else detector.result()),
        "mlm_loss": loss,
        "perplexity": float(np.exp(loss)),
        "accuracy": correct / count,
        "unigram_loss": total_uni / count,
        "sequences": int(n),
        "masked_tokens": int(count),
        "mask_rate": cfg.mask_rate,
    }


class DetectionScore:
    """The RTD discriminator's held-out scores over batches: its binary loss, its accuracy over
    every token beside the base rate (answering "original" everywhere), its recall and
    precision on the replaced ones, and its ROC AUC. The accuracy depends on the share of
    replaced tokens, which moves with the mask rate (the eval's is not the run's); the AUC
    does not, so it says whether the discriminator learned to tell replaced from original at
    all (0.5: not). The AUC ranks every scored token at once, so the scores are kept: 5 bytes
    a token, at most ``eval.max_sequences`` × seq_len tokens (2.6 MB at the defaults)."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.tokens = self.correct = self.replaced = self.flagged = self.caught = 0
        self.logits: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []

    def add(self, logits: torch.Tensor, replaced: torch.Tensor) -> None:
        flagged = logits > 0
        self.loss += F.binary_cross_entropy_with_logits(
            logits, replaced.float(), reduction="sum").item()
        self.tokens += replaced.numel()
        self.correct += int((flagged == replaced).sum())
        self.replaced += int(replaced.sum())
        self.flagged += int(flagged.sum())
        self.caught += int((flagged & replaced).sum())
        self.logits.append(logits.flatten())
        self.labels.append(replaced.flatten())

    def auc(self) -> float:
        """P(a replaced token scores above an original one), ties counting half: the
        Mann-Whitney statistic from the midranks of all logits."""
        logits, labels = torch.cat(self.logits).double(), torch.cat(self.labels)
        positives = int(labels.sum())
        negatives = labels.numel() - positives
        if not positives or not negatives:
            return float("nan")
        _, inverse, counts = torch.unique(logits, return_inverse=True, return_counts=True)
        midrank = counts.cumsum(0).double() - (counts.double() - 1) / 2
        rank_sum = midrank[inverse][labels].sum().item()
        return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)

    def result(self) -> dict[str, float]:
        """``rtd_*`` fields of eval.json (``mlm_loss`` and its kin are the generator's)."""
        return {"rtd_disc_loss": self.loss / self.tokens,
                "rtd_disc_accuracy": self.correct / self.tokens,
                "rtd_auc": self.auc(),
                "rtd_replaced_fraction": self.replaced / self.tokens,
                "rtd_recall": self.caught / max(self.replaced, 1),
                "rtd_precision": self.caught / max(self.flagged, 1)}


def detection_rows(result: dict[str, Any]) -> list[tuple[str, str]]:
    """The table rows `eval` and `cram` print for an RTD run's eval.json (none otherwise)."""
    if "rtd_disc_accuracy" not in result:
        return []
    auc = result.get("rtd_auc")
    return [("discriminator (RTD)",
             f"accuracy {result['rtd_disc_accuracy']:.1%} over all tokens (base rate "
             f"{1 - result['rtd_replaced_fraction']:.1%}), "
             + (f"AUC {auc:.3f}, " if auc is not None else "")
             + f"loss {result['rtd_disc_loss']:.3f}; {result['rtd_replaced_fraction']:.1%} of "
             f"tokens replaced at mask rate {result['mask_rate']:.0%}, recall "
             f"{result['rtd_recall']:.1%}, precision {result['rtd_precision']:.1%} (the MLM "
             "rows are the generator's)")]


def evaluate_run(
    run_dir: str | Path,
    data_dir: str | Path | None = None,
    overrides: list[str] | None = None,
    console: Console | None = None,
) -> dict:
    """Evaluate a finished run on its data dir's val split (or another data dir prepared with
    the same tokenizer); writes ``eval.json`` in the run dir and returns it."""
    run = RunDir(run_dir)
    model, meta = run.load_final()
    cfg = run.read_config(overrides)
    data = DataDir(data_dir if data_dir is not None else run.data_dir())
    if file_sha256(run.tokenizer_path) != data.manifest["tokenizer"]["sha256"]:
        raise ShoestringError(
            "this data dir was tokenized with a different tokenizer than the model's",
            where=str(data.path),
            fix="evaluate on data prepared with the run's tokenizer (the run's own data dir)",
        )
    result = evaluate_mlm(model, data, cfg.eval, cfg.train.precision, console)
    result["data_dir"] = str(data.path.resolve())
    write_json_atomic(run.eval_path, result)
    return result
