"""Evaluations for decoders (causal LMs): perplexity, zero-shot multiple choice, samples.

- **Perplexity** on held-out text: documents are tokenized, joined with ``<|endoftext|>`` the
  way CLM pretraining packs them, cut into windows of the model's sequence length, and every
  next-token prediction is scored. Besides the per-token loss, bits per byte (total nats /
  ln 2 / UTF-8 bytes) is reported: it does not depend on the tokenizer, so models with
  different vocabularies compare. Without a text file, the run's own validation split is used.
- **Multiple choice** by log-likelihood, zero-shot, as lm-evaluation-harness scores its
  ``multiple_choice`` tasks: each JSONL line holds
  ``{"context": str, "choices": [str, ...], "answer": int | str}``; every choice is scored as
  the sum of log p(choice tokens | context), tokenized the way lm-eval's ``_encode_pair`` does
  (context + choice encoded together, the context's trailing whitespace moved to the choice,
  no token before the context unless it is empty, then ``<|endoftext|>``). ``accuracy`` is
  lm-eval's ``acc`` (the highest sum), ``accuracy_norm`` its ``acc_norm`` (the highest sum
  divided by the choice's length in characters, which removes the bias toward short
  choices). Chance level is reported beside them.
- **Samples**: a few greedy continuations of prompts, for a human look.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from shoestring.device import DeviceInfo, select_device
from shoestring.errors import ShoestringError
from shoestring.classifier import collate
from shoestring.eval.tasks import iter_json_objects, read_utf8
from shoestring.model.losses import causal_lm_loss
from shoestring.progress import progress_bar
from shoestring.rundir import RunDir

EOS = "<|endoftext|>"
DEFAULT_PROMPTS = ["The", "In the beginning", "Once upon a time", "The president said"]

__all__ = ["evaluate_decoder", "greedy_samples", "multiple_choice", "perplexity",
           "read_choices", "read_documents"]


def read_documents(path: str | Path, text_field: str = "text") -> list[str]:
    """Documents of a .txt file (the whole file is one document) or a .jsonl file."""
    path = Path(path)
    text = read_utf8(path)
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        docs = [text] if text.strip() else []
    else:
        docs = []
        for where, obj in iter_json_objects(text, path):
            if not isinstance(obj.get(text_field), str):
                raise ShoestringError(f"expected an object with a string field {text_field!r}",
                                      where=where)
            docs.append(obj[text_field])
    if not docs:
        raise ShoestringError("no text to score (the file is empty)", where=str(path))
    return docs


@torch.no_grad()
def perplexity(
    model: torch.nn.Module, tokenizer: Any, docs: list[str], seq_len: int, eos_id: int | None,
    device: DeviceInfo, batch_size: int = 8, max_tokens: int | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Mean next-token loss, perplexity and bits per byte of ``docs``."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    stream: list[int] = []
    n_bytes = 0
    cut = False
    for enc, doc in zip(tokenizer.encode_batch(docs, add_special_tokens=False), docs):
        stream += enc.ids
        if eos_id is not None:
            stream.append(eos_id)
        n_bytes += len(doc.encode("utf-8"))
        if max_tokens is not None and len(stream) >= max_tokens + 1:
            cut = len(stream) > max_tokens + 1
            stream = stream[: max_tokens + 1]
            break
    if len(stream) < 2:
        raise ShoestringError("the text is too short to score (fewer than 2 tokens)")
    ids = torch.tensor(stream, dtype=torch.long)
    # Windows of seq_len inputs, each predicting the next token: all full but maybe the last.
    full, tail = divmod(len(ids) - 1, seq_len)
    groups = [list(range(i, min(i + batch_size, full))) for i in range(0, full, batch_size)]
    if tail:
        groups.append([full])

    def window(k: int) -> torch.Tensor:
        return ids[k * seq_len : k * seq_len + (seq_len if k < full else tail) + 1]

    batches = (torch.stack([window(k) for k in group]) for group in groups)
    total_nll, count = _next_token_nll(model, batches, device, console, "perplexity",
                                       full + (1 if tail else 0), "windows")
    loss = total_nll / count
    return {
        "loss": loss,
        "perplexity": float(math.exp(min(loss, 50.0))),
        # Tokenizer-independent; None when --max-tokens cut the text (bytes would not match).
        "bits_per_byte": total_nll / math.log(2) / max(1, n_bytes) if not cut else None,
        "tokens": count,
        "documents": len(docs),
        "bytes": n_bytes,
    }


def _next_token_nll(
    model: torch.nn.Module, batches: Iterable[torch.Tensor], device: DeviceInfo,
    console: Console | None, label: str, total: int, unit: str,
) -> tuple[float, int]:
    """(summed next-token loss, tokens predicted) over ``batches`` of rows, each row a window
    of inputs plus the token after it: the loop both perplexities share."""
    nll, count = 0.0, 0
    model.to(device.device).eval()
    with progress_bar(console or Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total, unit=unit)
        for rows in batches:
            rows = rows.to(device.device)
            with device.autocast():
                logits = model(rows[:, :-1])
            nll += causal_lm_loss(logits, rows, reduction="sum").item()
            count += rows[:, 1:].numel()
            bar.update(task, advance=len(rows))
    return nll, count


def read_choices(path: str | Path) -> list[dict[str, Any]]:
    """Multiple-choice items from JSONL: context, choices, answer (index or choice text)."""
    path = Path(path)
    items = []
    for where, obj in iter_json_objects(read_utf8(path), path):
        for key in ("context", "choices", "answer"):
            if key not in obj:
                raise ShoestringError(
                    f"missing field {key!r}", where=where,
                    fix='each line: {"context": "...", "choices": ["...", "..."], "answer": 0}',
                )
        ctx, choices, ans = obj["context"], obj["choices"], obj["answer"]
        if not isinstance(ctx, str):
            raise ShoestringError("context must be a string", where=where)
        if (not isinstance(choices, list) or len(choices) < 2
                or not all(isinstance(c, str) and c for c in choices)):
            raise ShoestringError("choices must be a list of at least two non-empty strings",
                                  where=where)
        if isinstance(ans, str):
            if ans not in choices:
                raise ShoestringError(f"answer {ans!r} is not one of the choices", where=where)
            ans = choices.index(ans)
        if isinstance(ans, bool) or not isinstance(ans, int) or not 0 <= ans < len(choices):
            raise ShoestringError(
                f"answer must be a choice index 0..{len(choices) - 1} or a choice's text",
                where=where,
            )
        items.append({"context": ctx, "choices": choices, "answer": ans, "where": where})
    if not items:
        raise ShoestringError("no multiple-choice items (the file is empty)", where=str(path))
    return items


def encode_pair(tokenizer: Any, context: str, continuation: str,
                eot_id: int | None) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's ``HFLM._encode_pair`` makes them: the
    context's trailing whitespace moves to the continuation, the two are encoded together and
    split after the context's own tokens (so the boundary tokenizes as in running text), and
    an empty context becomes ``[eot_id]`` — no token is put before a non-empty one."""
    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    n_space = len(context) - len(context.rstrip())
    if n_space:
        context, continuation = context[:-n_space], context[-n_space:] + continuation
    if not context:
        return ([eot_id] if eot_id is not None else []), enc(continuation)
    ctx = enc(context)
    return ctx, enc(context + continuation)[len(ctx):]


def pick_choices(logliks: list[float], choices: list[str]) -> tuple[int, int]:
    """The choice lm-eval's ``acc`` picks (the highest summed log-likelihood) and the one its
    ``acc_norm`` picks (the highest log-likelihood per character of the choice's text)."""
    norm = [ll / max(1, len(c)) for ll, c in zip(logliks, choices)]
    return int(np.argmax(logliks)), int(np.argmax(norm))


@torch.no_grad()
def multiple_choice(
    model: torch.nn.Module, tokenizer: Any, items: list[dict[str, Any]], seq_len: int,
    device: DeviceInfo, bos_id: int | None = None, console: Console | None = None,
) -> dict[str, Any]:
    """Zero-shot accuracy by log-likelihood: lm-eval's ``acc`` and ``acc_norm`` (module doc).
    ``bos_id`` is the token an empty context becomes (lm-eval uses the end-of-text token)."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    model.to(device.device).eval()
    correct = correct_norm = 0
    chance = 0.0
    console = console or Console(stderr=True)
    with progress_bar(console) as bar:
        task = bar.add_task("multiple choice", total=len(items), unit="items")
        for item in items:
            rows, spans = [], []
            for choice in item["choices"]:
                text = choice
                if item["context"] and not item["context"][-1].isspace() and not choice[0].isspace():
                    text = " " + choice
                ctx, cont = encode_pair(tokenizer, item["context"], text, bos_id)
                cont = cont or [0]
                seq = (ctx + cont)[-(seq_len + 1):]
                rows.append(seq)
                spans.append(min(len(cont), len(seq) - 1))
            inputs = [np.asarray(r[:-1], dtype=np.int64) for r in rows]
            x, mask = collate(inputs, np.arange(len(rows)), 0)  # right-padded: real tokens first
            with device.autocast():
                logits = model(x.to(device.device), mask.to(device.device))
            logp = logits.float().log_softmax(-1).cpu()
            scores = []
            for i, r in enumerate(rows):
                n_cont = spans[i]
                targets = torch.tensor(r[-n_cont:])
                pos = torch.arange(len(r) - 1 - n_cont, len(r) - 1)
                scores.append(logp[i, pos, targets].sum().item())
            acc, acc_norm = pick_choices(scores, item["choices"])
            correct += int(acc == item["answer"])
            correct_norm += int(acc_norm == item["answer"])
            chance += 1.0 / len(item["choices"])
            bar.update(task, advance=1)
    n = len(items)
    return {"accuracy": correct / n, "accuracy_norm": correct_norm / n, "chance": chance / n,
            "items": n}


@torch.no_grad()
def greedy_samples(
    model: torch.nn.Module, tokenizer: Any, prompts: list[str], max_new_tokens: int,
    eos_id: int | None, device: DeviceInfo, bos_id: int | None = None,
    temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
) -> list[dict[str, str]]:
    """Continuations of each prompt, decoded: greedy at temperature 0 (the default), else
    sampled with ``top_k`` from a generator seeded with ``seed`` (repeatable), as serve
    samples — a small decoder often loops ("And, And, And") when greedy."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    model.to(device.device).eval()
    out = []
    gen = torch.Generator(device=device.device).manual_seed(seed) if temperature > 0 else None
    for prompt in prompts:
        ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        if bos_id is not None:
            ids = [bos_id, *ids]
        if not ids:
            continue
        x = torch.tensor([ids], device=device.device)
        with device.autocast():
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k,
                               eos_id=eos_id, generator=gen)
        new = y[0, len(ids):].tolist()
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id)]
        out.append({"prompt": prompt, "continuation": tokenizer.decode(new)})
    return out


def describe_decoding(temperature: float, top_k: int | None, seed: int) -> str:
    """How text was decoded, printed beside it: greedy and sampled text read differently."""
    if temperature <= 0:
        return "greedy (--temperature 0)"
    return (f"sampled (temperature {temperature:g}"
            + (f", top-k {top_k}" if top_k is not None else "") + f", seed {seed})")


def evaluate_decoder(
    run_dir: str | Path,
    text: str | Path | None = None,
    choices: str | Path | None = None,
    samples: int = 3,
    prompts: list[str] | None = None,
    max_new_tokens: int = 48,
    temperature: float = 0.0,
    top_k: int | None = None,
    max_tokens: int | None = None,
    precision: str = "auto",
    out: str | Path | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Perplexity (on ``text`` or the run's validation split), multiple choice (``choices``)
    and ``samples`` samples (greedy unless ``temperature`` > 0) of a decoder run; writes
    ``decoder_eval.json``."""
    from shoestring.data.tokenizer import load_tokenizer
    from shoestring.fsutil import write_json_atomic
    run = RunDir(run_dir)
    model, meta = run.load_final()
    if not hasattr(model, "generate"):
        raise ShoestringError(
            f"decoder evals need a causal LM; this run is {meta.get('architecture')!r}",
            where=str(run.path),
            fix="for encoder runs use --glue/--task (fine-tuning) or plain eval (MLM loss)",
        )
    console = console or Console(stderr=True)
    tokenizer = load_tokenizer(run.tokenizer_path)
    special = meta.get("special_ids", {})
    eos_id = special.get(EOS)
    seq_len = int(meta.get("seq_len", 512))
    device = select_device(precision, measure_peak=False)
    result: dict[str, Any] = {"run": str(run.path), "architecture": meta.get("architecture"),
                              "device": device.name, "dtype": str(device.dtype).removeprefix("torch.")}
    if text is not None:
        docs = read_documents(text)
        result["perplexity"] = {"source": str(text), **perplexity(
            model, tokenizer, docs, seq_len, eos_id, device, max_tokens=max_tokens, console=console)}
    else:
        result["perplexity"] = {"source": "run validation split",
                                **_val_split_perplexity(model, run, device, max_tokens, console)}
    if choices is not None:
        items = read_choices(choices)
        result["multiple_choice"] = {"source": str(choices), **multiple_choice(
            model, tokenizer, items, seq_len, device, bos_id=eos_id, console=console)}
    if samples > 0:
        use = (prompts or DEFAULT_PROMPTS)[:samples]
        result["samples"] = greedy_samples(model, tokenizer, use, max_new_tokens, eos_id, device,
                                           bos_id=eos_id, temperature=temperature, top_k=top_k)
        result["samples_decoding"] = describe_decoding(temperature, top_k, 0)
    target = Path(out) / run.decoder_eval_path.name if out is not None else run.decoder_eval_path
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, result)
    result["written"] = str(target)
    return result


@torch.no_grad()
def _val_split_perplexity(
    model: torch.nn.Module, run: RunDir, device: DeviceInfo, max_tokens: int | None,
    console: Console, batch_size: int = 8,
) -> dict[str, Any]:
    """Next-token loss on the packed validation windows of the run's own data dir."""
    from shoestring.data.datadir import DataDir
    data = DataDir(run.data_dir())
    val = data.split("val", verify=True)
    n = len(val)
    if max_tokens is not None:
        n = max(1, min(n, max_tokens // data.seq_len))
    batches = (torch.from_numpy(val.take(np.arange(start, min(start + batch_size, n))).astype(np.int64))
               for start in range(0, n, batch_size))
    total, count = _next_token_nll(model, batches, device, console, "perplexity (val)", n, "seqs")
    loss = total / count
    return {"loss": loss, "perplexity": float(math.exp(min(loss, 50.0))), "tokens": count,
            "sequences": n}
