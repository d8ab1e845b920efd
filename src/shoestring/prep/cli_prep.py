"""The body of `shoestring prep`: run prep on the resolved settings and print what it made
(the blocks' counts, the split, the vocabulary, the sequences, the time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from shoestring.config import Config
from shoestring.consoles import err, out
from shoestring.errors import ShoestringError
from shoestring.units import counted


def run(sources: list[str], output: Path, cfg: Config, *, decontam: list[str] | None,
        dedup_against: list[str] | None, overwrite: bool, executor: str,
        ray_address: str | None) -> None:
    """Prep ``sources`` into ``output`` with ``cfg`` (``--decontam`` and ``--dedup-against``
    add to its lists) and print the data dir's table; Ctrl-C says how to resume."""
    from shoestring.fsutil import unique_paths
    from shoestring.prep.prep import build_dir, prep

    if decontam:
        cfg.curate.decontam = [*cfg.curate.decontam, *decontam]
    if dedup_against:
        cfg.curate.dedup_against = unique_paths([*cfg.curate.dedup_against, *dedup_against])
    ray_options = _ray_options(executor, ray_address)
    try:
        manifest = prep(sources, output, cfg.data, console=err, curate=cfg.curate,
                        overwrite=overwrite, executor=executor, executor_options=ray_options)
    except KeyboardInterrupt:
        err.print(f"interrupted: finished stages are kept in {build_dir(output)}; "
                  "run the same command again to resume", markup=False, highlight=False,
                  soft_wrap=True)
        raise SystemExit(130) from None
    _print_prep(manifest, output)


def mix_flag(mix: str | None, mix_field: str | None) -> dict[str, tuple[str, Any]]:
    """``--mix`` (and ``--mix-field``) as the ``data.mixture`` setting, a config flag."""
    if mix_field is not None and mix is None:
        raise ShoestringError("--mix-field needs --mix", where="--mix-field")
    if mix is None:
        return {}
    from shoestring.data.mixture import parse_mix

    return {"--mix": ("data.mixture", parse_mix(mix, mix_field))}


def _ray_options(executor: str, address: str | None) -> Any:
    if executor not in ("local", "ray"):
        raise ShoestringError(f"unknown executor {executor!r}", where="--executor",
                              fix="use local or ray")
    if executor == "local":
        if address is not None:
            raise ShoestringError("--ray-address needs --executor ray", where="--ray-address")
        return None
    from shoestring.prep.ray.runner import RayOptions

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
