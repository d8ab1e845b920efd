"""`shoestring prep`: sources → clean → split → tokenizer → pack → shards + manifest.

Streaming: documents pass through a cleaned-text spool file in the build folder, so memory
holds one encoding batch at a time, not the corpus. The data dir is built in a sibling
temporary folder and swapped in at the end, so an existing data dir is never left
half-written: a failed or interrupted prep leaves the previous one intact.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.console import Console

from shoestring import __version__
from shoestring.config import DataConfig
from shoestring.data.clean import clean_text
from shoestring.data.datadir import FORMAT
from shoestring.data.shards import ShardWriter, token_dtype
from shoestring.data.sources import ReadStats, iter_documents, resolve_sources
from shoestring.data.tokenizer import CLS, SEP, file_sha256, special_ids, train_wordpiece
from shoestring.errors import ShoestringError
from shoestring.fsutil import (
    building_dir,
    check_output_dir,
    recover_interrupted_swap,
    write_json_atomic,
)
from shoestring.progress import progress_bar

ENCODE_BATCH = 1024


def is_validation(text: str, val_fraction: float) -> bool:
    """Deterministic split by the document's content hash (duplicates share a split)."""
    h = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")
    return h / 2**64 < val_fraction


def pack_mlm(stream: np.ndarray, seq_len: int, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut a token stream into ``[CLS] chunk [SEP]`` rows of ``seq_len``; return (rows, rest).

    Documents arrive joined by ``[SEP]``, so no padding is needed and no token is wasted except
    the final partial chunk of the corpus.
    """
    body = seq_len - 2
    n = len(stream) // body
    rows = np.empty((n, seq_len), dtype=np.int64)
    rows[:, 0] = cls_id
    rows[:, 1:-1] = stream[: n * body].reshape(n, body)
    rows[:, -1] = sep_id
    return rows, stream[n * body :]


def _fingerprint(specs: list[str], files: list[str], cfg: DataConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"specs": specs, "cfg": cfg.model_dump(mode="json")}, sort_keys=True).encode())
    for f in files:
        p = Path(f)
        if p.is_file():
            st = p.stat()
            h.update(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
        else:
            h.update(f.encode())
    return h.hexdigest()


def data_fingerprint(specs: list[str], cfg: DataConfig) -> str:
    """What a data dir was built from; `cram` reuses a data dir whose fingerprint matches."""
    return _fingerprint(specs, resolve_sources(specs), cfg)


def _is_data_dir(path: Path) -> bool:
    try:
        return json.loads((path / "manifest.json").read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _read_spool(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def prep(
    specs: list[str], out: str | Path, cfg: DataConfig, console: Console | None = None
) -> dict:
    """Build a data dir at ``out`` from source specs; returns the manifest."""
    console = console or Console(stderr=True)
    out = Path(out)
    recover_interrupted_swap(out)
    check_output_dir(out, "data dir", owned=_is_data_dir(out), overwrite=True)
    files = resolve_sources(specs)
    with building_dir(out) as build:
        return _build(specs, files, build, cfg, console)


def _build(specs: list[str], files: list[str], build: Path, cfg: DataConfig, console: Console) -> dict:
    t0 = time.perf_counter()
    stats = ReadStats()
    counts = {"read": 0, "too_short": 0, "kept": 0, "train": 0, "val": 0, "chars": 0}
    spools = {"train": build / "spool-train.jsonl", "val": build / "spool-val.jsonl"}
    with progress_bar(console) as bar, open(spools["train"], "w", encoding="utf-8") as ftr, open(
        spools["val"], "w", encoding="utf-8"
    ) as fva:
        task = bar.add_task("reading + cleaning", total=None, unit="docs")
        for doc in iter_documents(specs, text_field=cfg.text_field, on_error=cfg.on_error, stats=stats):
            counts["read"] += 1
            text = clean_text(doc.text)
            if len(text) < cfg.min_chars:
                counts["too_short"] += 1
            else:
                split = "val" if is_validation(text, cfg.val_fraction) else "train"
                counts[split] += 1
                counts["kept"] += 1
                counts["chars"] += len(text)
                (fva if split == "val" else ftr).write(json.dumps(text, ensure_ascii=False) + "\n")
            bar.update(task, advance=1)
    if counts["kept"] == 0:
        raise ShoestringError(
            f"the corpus is empty after cleaning: {counts['read']} documents read, "
            f"{counts['too_short']} shorter than data.min_chars={cfg.min_chars}, "
            f"{len(stats.skipped)} skipped as bad input",
            where=", ".join(specs),
            fix="check the sources (and data.text_field for JSON lines)",
        )
    if counts["train"] == 0:
        raise ShoestringError(
            f"all {counts['kept']} documents fell into the validation split",
            where=", ".join(specs),
            fix="add more documents or lower data.val_fraction",
        )

    with console.status("training the WordPiece tokenizer"):
        tok = train_wordpiece(
            _read_spool(spools["train"]), cfg.vocab_size, cfg.lowercase, length=counts["train"]
        )
    tok.save(str(build / "tokenizer.json"))
    ids = special_ids(tok)
    vocab = tok.get_vocab_size()
    dtype = token_dtype(vocab)

    splits: dict[str, dict] = {}
    with progress_bar(console) as bar:
        for split in ("train", "val"):
            task = bar.add_task(f"tokenizing + packing {split}", total=counts[split], unit="docs")
            writer = ShardWriter(build, split, dtype, cfg.shard_tokens)
            rest = np.empty(0, dtype=np.int64)
            n_tokens = 0
            batch: list[str] = []
            for text in _read_spool(spools[split]):
                batch.append(text)
                if len(batch) == ENCODE_BATCH:
                    rest, n = _encode_pack(tok, batch, rest, writer, cfg.seq_len, ids)
                    n_tokens += n
                    bar.update(task, advance=len(batch))
                    batch = []
            if batch:
                rest, n = _encode_pack(tok, batch, rest, writer, cfg.seq_len, ids)
                n_tokens += n
                bar.update(task, advance=len(batch))
            splits[split] = writer.close() | {
                "documents": counts[split],
                "document_tokens": n_tokens,
                "dropped_tail_tokens": int(len(rest)),
            }
            spools[split].unlink()

    if splits["val"]["sequences"] == 0:
        raise ShoestringError(
            f"the validation split has no complete sequence: {counts['val']} documents with "
            f"{splits['val']['document_tokens']} tokens, fewer than one sequence of "
            f"{cfg.seq_len}",
            where=", ".join(specs),
            fix="add more text, raise data.val_fraction, or lower data.seq_len",
        )
    manifest = {
        "format": FORMAT,
        "shoestring_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sources": specs,
        "files": len(files),
        "fingerprint": _fingerprint(specs, files, cfg),
        "config": cfg.model_dump(mode="json"),
        "documents": {
            "read": counts["read"],
            "skipped_bad_input": len(stats.skipped),
            "dropped_too_short": counts["too_short"],
            "kept": counts["kept"],
            "train": counts["train"],
            "val": counts["val"],
            "characters": counts["chars"],
        },
        "skipped_examples": stats.skipped[:20],
        "tokenizer": {
            "file": "tokenizer.json",
            "kind": "wordpiece",
            "vocab_size": vocab,
            "special_ids": ids,
            "sha256": file_sha256(build / "tokenizer.json"),
        },
        "objective": "mlm",
        "seq_len": cfg.seq_len,
        "dtype": dtype.str,
        "splits": splits,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    write_json_atomic(build / "manifest.json", manifest)
    return manifest


def _encode_pack(tok, batch: list[str], rest: np.ndarray, writer: ShardWriter, seq_len: int, ids: dict[str, int]) -> tuple[np.ndarray, int]:
    encodings = tok.encode_batch(batch, add_special_tokens=False)
    sep = np.array([ids[SEP]], dtype=np.int64)
    pieces = [rest]
    n = 0
    for enc in encodings:
        pieces.append(np.asarray(enc.ids, dtype=np.int64))
        pieces.append(sep)
        n += len(enc.ids)
    rows, rest = pack_mlm(np.concatenate(pieces), seq_len, ids[CLS], ids[SEP])
    writer.add(rows)
    return rest, n
