"""The curation blocks `prep` runs between the clean block and the split: `Curator`.

Integration (what ``prep`` does, after its own clean block normalized the text and applied
``data.min_chars``)::

    curator = Curator.from_config(cfg.curate)
    for doc in curator.run(cleaned_documents):        # streaming, in input order
        ... split / spool ...
    manifest["blocks"] += curator.stats()["blocks"]    # the printed table reads these
    print(curator.explain(cfg.curate.explain))         # with --explain N

Cramming's compressibility filter needs the trained tokenizer, so it runs while tokenizing
(``curate/compress.py``), outside the curator.

Memory: blocks hold no documents except fuzzy dedup's current batch (256) and the dedup
indexes (about 100 bytes per distinct document for exact; for fuzzy, at most ~60 bytes per
document while it decides, its band keys and documents being spilled to disk) — except
substring dedup, which holds the whole corpus plus ~125 bytes per word, and so refuses more
than ``curate.substring_max_mb`` of text (docs/data.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from shoestring.config import CurateConfig
from shoestring.prep.curate.blocks import Block, Example
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError


class Curator:
    """An ordered list of blocks, and the ``--dedup-against`` indexes they consult."""

    def __init__(self, blocks: list[Block], against: list[Any] | None = None) -> None:
        self.blocks = blocks
        self.against = against or []  # dedup_index.DedupIndex of --dedup-against

    @classmethod
    def from_config(cls, cfg: CurateConfig, *, work_dir: Path | None = None,
                    index_dir: Path | None = None) -> Curator:
        """Build the blocks ``cfg`` asks for, in the documented order: length, the quality
        filters, dedup, decontamination (normalization and ``data.min_chars`` come before, in
        prep's clean block). A block's parameter ``x`` is the setting ``curate.PREFIX_x``
        (``gopher_``, ``rep_``, ``minhash_``, ``substring_``, ``decontam_``).

        Stateless blocks (``stateful = False``) may run in several processes; the stateful
        ones (dedup) must see every document in one. Decontamination reads its
        evaluation files here, so a bad path fails before any corpus work; likewise the
        ``dedup_against`` indexes are opened and checked here.

        ``work_dir``: where fuzzy dedup spills (a temporary folder of its own inside;
        default: the system's temporary folder). ``index_dir``: where the dedup blocks write
        this corpus's dedup index (``dedup_index``); None writes none.
        """
        from shoestring.prep.curate import decontam, dedup, gopher, minhash, normalize, substring

        ex = {"keep_examples": cfg.explain}
        blocks: list[Block] = []
        if cfg.max_chars is not None:
            blocks.append(normalize.Length(cfg.max_chars, **ex))
        if cfg.filters == "gopher":
            blocks += [_build(gopher.GopherQuality, cfg, "gopher_", **ex),
                       _build(gopher.GopherRepetition, cfg, "rep_", **ex)]
        against = _open_against(cfg)
        if cfg.dedup != "none":
            blocks.append(dedup.ExactDedup(cfg.explain, against, index_dir))
        if cfg.dedup == "fuzzy":
            blocks.append(_build(minhash.FuzzyDedup, cfg, "minhash_", **ex, work_dir=work_dir,
                                 against=against, index_dir=index_dir,
                                 name_partners=cfg.dropped_ids))
        if cfg.dedup == "substring":
            blocks.append(_build(substring.SubstringDedup, cfg, "substring_", **ex))
        # Decontamination last (as in MT-NLG): fewer documents to check, and cut pieces are
        # not re-judged by the filters.
        if cfg.decontam:
            index = decontam.EvalNgrams.from_paths(cfg.decontam, cfg.decontam_ngram,
                                                   cfg.decontam_min_words)
            blocks.append(_build(decontam.Decontaminate, cfg, "decontam_", index, **ex,
                                 elsewhere=("decontam_ngram", "decontam_min_words")))
        return cls(blocks, against)

    def finish_dedup_index(self, folder: Path) -> dict[str, Any] | None:
        """After ``run``: write ``index.json`` beside the arrays the dedup blocks wrote in
        ``folder`` (their ``index_dir``); the manifest's ``dedup_index`` (None: no dedup)."""
        from shoestring.prep.curate import dedup_index

        by_name = {b.name: b for b in self.blocks}
        exact = by_name.get("exact_dedup")
        if exact is None:
            return None
        fuzzy = by_name.get("fuzzy_dedup")
        minhash = None if fuzzy is None else {**fuzzy.settings(), "documents": fuzzy.indexed}
        return dedup_index.finish(folder, exact.report()["distinct"], minhash)

    def against_summary(self) -> list[dict[str, Any]]:
        """The manifest's ``dedup_against``: each earlier data dir and what it dropped."""
        from shoestring.prep.curate.dedup_index import against_summary

        return against_summary(self.stats()["blocks"], self.against)

    def run(self, docs: Iterable[Document],
            on_drop: Callable[[str, str, str], None] | None = None) -> Iterator[Document]:
        """The kept documents, in input order, streaming through every block.

        ``on_drop(doc_id, block_name, of)``, when given, is told every document a block
        dropped (``curate.dropped_ids``: the list a benchmark scores dedup against), with
        the earlier document it repeats where the block names it (``of``, else "").
        """
        stream: Iterable[Document] = docs
        for block in self.blocks:
            block.on_drop = on_drop
            stream = block.process(stream)
        yield from stream

    def stats(self) -> dict[str, Any]:
        """Manifest entry: per block in, out, drops per reason, and block figures."""
        blocks = [b.report() for b in self.blocks]
        return {
            "blocks": blocks,
            "documents_in": blocks[0]["documents_in"] if blocks else 0,
            "documents_out": blocks[-1]["documents_out"] if blocks else 0,
        }

    def examples(self) -> dict[str, dict[str, list[Example]]]:
        """Kept dropped-document examples: block → reason → examples."""
        return {b.name: b.examples for b in self.blocks if b.examples}

    def explain(self, n: int | None = None) -> str:
        """Up to ``n`` dropped documents per block and reason, as plain text."""
        return format_explain(self.examples(), n)


def _open_against(cfg: CurateConfig) -> list[Any]:
    """The ``--dedup-against`` indexes, checked against this run's dedup settings."""
    if not cfg.dedup_against:
        return []
    if cfg.dedup == "none":
        raise ShoestringError("--dedup-against needs dedup on", where="--dedup none",
                              fix="use --dedup exact or --dedup fuzzy with --dedup-against")
    from shoestring.prep.curate.dedup_index import DedupIndex

    minhash = None if cfg.dedup != "fuzzy" else {
        "ngram": cfg.minhash_ngram, "bands": cfg.minhash_bands, "rows": cfg.minhash_rows,
        "seed": cfg.minhash_seed}
    return [DedupIndex.open(p, minhash) for p in cfg.dedup_against]


def _build(block: type[Block], cfg: CurateConfig, prefix: str, *args: Any,
           elsewhere: tuple[str, ...] = (), **kwargs: Any) -> Block:
    """``block(*args, **kwargs)``, each of its parameters ``x`` that ``cfg`` names
    ``PREFIX_x`` set to that setting. A ``PREFIX_`` setting the block has no parameter for
    (and that is not one of the ``elsewhere`` ones the caller used) is a bug — a renamed
    parameter would silently fall back to its default — so it raises."""
    names = inspect.signature(block).parameters
    ours = [f for f in type(cfg).model_fields if f.startswith(prefix) and f not in elsewhere]
    unused = [f for f in ours if f.removeprefix(prefix) not in names]
    if unused:
        raise TypeError(f"{block.__name__} has no parameter for curate.{', curate.'.join(unused)}")
    return block(*args, **{f.removeprefix(prefix): getattr(cfg, f) for f in ours}, **kwargs)


def format_explain(examples: dict[str, dict[str, list[Example]]], n: int | None = None) -> str:
    if not examples:
        return "no dropped documents to explain"
    out: list[str] = []
    for block, reasons in examples.items():
        for reason, kept in reasons.items():
            out.append(f"== {block}: {reason} ==")
            for ex in kept[:n]:
                detail = f": {ex.detail}" if ex.detail else ""
                out.append(f"-- {ex.doc_id} ({ex.chars:,} characters){detail}")
                excerpt = ex.excerpt.replace("\n", "\n   ")
                ellipsis = " […]" if ex.chars > len(ex.excerpt) else ""
                out.append(f"   {excerpt}{ellipsis}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"
