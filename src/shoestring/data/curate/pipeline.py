"""The curation pipeline `prep` runs: blocks chained as generators, plus their report.

Integration (what ``prep`` does; its own clean stage already normalized and applied
``data.min_chars``, hence ``clean=False``)::

    curator = Curator.from_config(cfg.curate, clean=False)
    for doc in curator.run(cleaned_documents):        # streaming, in input order
        ... split / spool ...
    manifest["blocks"] += curator.stats()["blocks"]    # the printed table reads these
    print(curator.explain(cfg.curate.explain))         # with --explain N

    # while tokenizing (needs the trained tokenizer), Cramming's filter:
    check = Compressibility.from_config(cfg.curate)    # None when off
    keep = check.check_batch(n_tokens, n_chars, docs)  # or check.check(n, chars, doc)

A corpus reduced to nothing: ``curator.empty_error(where)`` names what each block removed.

Memory: blocks hold no documents except fuzzy dedup's current batch (256) and the dedup
indexes (about 100 bytes per distinct document for exact; for fuzzy, at most ~60 bytes per
document while it decides, its band keys and documents being spilled to disk) — except
substring dedup, which holds the whole corpus plus ~125 bytes per word, and so refuses more
than ``curate.substring_max_mb`` of text (docs/data.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from shoestring.config import CurateConfig
from shoestring.data.curate.blocks import Block, Example
from shoestring.data.curate.compress import Compressibility
from shoestring.data.sources import Document
from shoestring.errors import ShoestringError

Part = Literal["all", "stateless", "stateful"]


class Curator:
    """An ordered list of blocks and the post-tokenizer compressibility check."""

    def __init__(self, blocks: list[Block], compress: Compressibility | None = None,
                 against: list[Any] | None = None) -> None:
        self.blocks = blocks
        self.compress = compress
        self.against = against or []  # dedup_index.DedupIndex of --dedup-against

    @classmethod
    def from_config(
        cls, cfg: CurateConfig, *, min_chars: int = 1, clean: bool = True, part: Part = "all",
        work_dir: Path | None = None, index_dir: Path | None = None,
    ) -> Curator:
        """Build the blocks ``cfg`` asks for, in the documented order.

        ``clean=False`` leaves out normalization and the ``min_chars`` limit, for callers
        that already did both (``prep`` normalizes in its worker processes); a
        ``curate.max_chars`` limit still applies.

        ``part`` splits the pipeline for parallel prep: ``"stateless"`` blocks (normalize,
        length, filters, decontamination) can run in each worker; the ``"stateful"`` ones
        (dedup) must see every document in one process. Decontamination reads its
        evaluation files here, so a bad path fails before any corpus work; likewise the
        ``dedup_against`` indexes are opened and checked here.

        ``work_dir``: where fuzzy dedup spills (a temporary folder of its own inside;
        default: the system's temporary folder). ``index_dir``: where the dedup blocks write
        this corpus's dedup index (``dedup_index``); None writes none.
        """
        ex = cfg.explain
        stateless: list[Block] = []
        stateful: list[Block] = []
        from shoestring.data.curate.normalize import Length, Normalize

        if clean:
            stateless += [Normalize(ex), Length(min_chars, cfg.max_chars, ex)]
        elif cfg.max_chars is not None:
            stateless.append(Length(1, cfg.max_chars, ex))
        if cfg.filters == "gopher":
            from shoestring.data.curate.gopher import GopherQuality, GopherRepetition

            stateless.append(
                GopherQuality(
                    cfg.gopher_min_words,
                    cfg.gopher_max_words,
                    cfg.gopher_min_mean_word_len,
                    cfg.gopher_max_mean_word_len,
                    cfg.gopher_max_symbol_word_ratio,
                    cfg.gopher_max_bullet_lines,
                    cfg.gopher_max_ellipsis_lines,
                    cfg.gopher_min_alpha_words,
                    cfg.gopher_min_stop_words,
                    cfg.gopher_stop_words,
                    ex,
                )
            )
            stateless.append(
                GopherRepetition(
                    cfg.rep_max_dup_line_frac,
                    cfg.rep_max_dup_para_frac,
                    cfg.rep_max_dup_line_char_frac,
                    cfg.rep_max_dup_para_char_frac,
                    cfg.rep_max_top_ngram_frac,
                    cfg.rep_max_dup_ngram_frac,
                    ex,
                )
            )
        against = _open_against(cfg)
        if cfg.dedup in ("exact", "fuzzy", "substring"):
            from shoestring.data.curate.dedup import ExactDedup

            stateful.append(ExactDedup(ex, against, index_dir))
        if cfg.dedup == "fuzzy":
            from shoestring.data.curate.minhash import FuzzyDedup

            stateful.append(
                FuzzyDedup(
                    cfg.minhash_ngram,
                    cfg.minhash_bands,
                    cfg.minhash_rows,
                    cfg.minhash_seed,
                    keep_examples=ex,
                    work_dir=work_dir,
                    against=against,
                    index_dir=index_dir,
                    threshold=cfg.minhash_threshold,
                )
            )
        if cfg.dedup == "substring":
            from shoestring.data.curate.substring import SubstringDedup

            stateful.append(SubstringDedup(cfg.substring_min_span, ex, cfg.substring_max_mb))
        decontam: list[Block] = []
        if cfg.decontam:
            from shoestring.data.curate.decontam import Decontaminate, EvalNgrams

            index = EvalNgrams.from_paths(cfg.decontam, cfg.decontam_ngram, cfg.decontam_min_words)
            decontam.append(
                Decontaminate(
                    index,
                    cfg.decontam_mode,
                    cfg.decontam_margin_chars,
                    cfg.decontam_max_pieces,
                    cfg.decontam_min_piece_chars,
                    ex,
                )
            )
        compress = Compressibility.from_config(cfg)
        if part == "stateless":
            return cls(stateless + decontam, compress)
        if part == "stateful":
            return cls(stateful, against=against)
        # Decontamination last (as in MT-NLG): fewer documents to check, and cut pieces are
        # not re-judged by the filters.
        return cls(stateless + stateful + decontam, compress, against)

    def finish_dedup_index(self, folder: Path) -> dict[str, Any] | None:
        """After ``run``: write ``index.json`` beside the arrays the dedup blocks wrote in
        ``folder`` (their ``index_dir``); the manifest's ``dedup_index`` (None: no dedup)."""
        from shoestring.data.curate import dedup_index

        by_name = {b.name: b for b in self.blocks}
        exact = by_name.get("exact_dedup")
        if exact is None:
            return None
        fuzzy = by_name.get("fuzzy_dedup")
        minhash = None if fuzzy is None else {**fuzzy.settings(), "documents": fuzzy.indexed}
        return dedup_index.finish(folder, exact.report()["distinct"], minhash)

    def against_summary(self) -> list[dict[str, Any]]:
        """The manifest's ``dedup_against``: each earlier data dir and what it dropped."""
        from shoestring.data.curate.dedup_index import against_summary

        return against_summary(self.stats()["blocks"], self.against)

    def run(self, docs: Iterable[Document],
            on_drop: Callable[[str, str], None] | None = None) -> Iterator[Document]:
        """The kept documents, in input order, streaming through every block.

        ``on_drop(doc_id, block_name)``, when given, is told every document a block
        dropped (``curate.dropped_ids``: the list a benchmark scores dedup against).
        """
        stream: Iterable[Document] = docs
        for block in self.blocks:
            block.on_drop = on_drop
            stream = block.process(stream)
        yield from stream

    def compress_ok(self, n_tokens: int, n_chars: int, doc: Document | None = None) -> bool:
        """Post-tokenizer check (Cramming): True if the document is kept. Always True when off."""
        return True if self.compress is None else self.compress.check(n_tokens, n_chars, doc)

    def all_blocks(self) -> list[Block]:
        return self.blocks + ([self.compress] if self.compress is not None else [])

    def stats(self) -> dict[str, Any]:
        """Manifest entry: per block in, out, drops per reason, and block figures."""
        blocks = [b.report() for b in self.all_blocks()]
        stream = [b for b in blocks if b["block"] != "compressibility"]
        return {
            "blocks": blocks,
            "documents_in": stream[0]["documents_in"] if stream else 0,
            "documents_out": stream[-1]["documents_out"] if stream else 0,
        }

    def merge(self, stats: dict[str, Any]) -> None:
        """Add the counts of another curator with the same blocks (a worker's ``stats()``)."""
        mine = {b.name: b for b in self.all_blocks()}
        for entry in stats["blocks"]:
            if entry["block"] in mine:  # same block names: same configuration
                mine[entry["block"]].stats.merge(entry)

    def examples(self) -> dict[str, dict[str, list[Example]]]:
        """Kept dropped-document examples: block → reason → examples."""
        return {b.name: b.examples for b in self.all_blocks() if b.examples}

    def explain(self, n: int | None = None) -> str:
        """Up to ``n`` dropped documents per block and reason, as plain text."""
        return format_explain(self.examples(), n)

    def empty_error(self, where: str) -> ShoestringError:
        """The error for a corpus that curation reduced to nothing: which block removed what."""
        return empty_corpus_error(self.stats(), where)


def _open_against(cfg: CurateConfig) -> list[Any]:
    """The ``--dedup-against`` indexes, checked against this run's dedup settings."""
    if not cfg.dedup_against:
        return []
    if cfg.dedup == "none":
        raise ShoestringError("--dedup-against needs dedup on", where="--dedup none",
                              fix="use --dedup exact or --dedup fuzzy with --dedup-against")
    from shoestring.data.curate.dedup_index import open_against

    minhash = None if cfg.dedup != "fuzzy" else {
        "ngram": cfg.minhash_ngram, "bands": cfg.minhash_bands, "rows": cfg.minhash_rows,
        "seed": cfg.minhash_seed}
    return open_against(cfg.dedup_against, minhash)


# --- reporting (works from the stats dict, so the CLI prints exactly what the manifest holds)


def summarize_drops(entry: dict[str, Any], top: int = 3) -> str:
    """``"120 (too_few_words 100, stop_words 20)"`` for one block's entry."""
    total = sum(entry["dropped"].values())
    if not total:
        return "0"
    reasons = list(entry["dropped"].items())
    shown = ", ".join(f"{r} {n:,}" for r, n in reasons[:top])
    more = f", +{len(reasons) - top} more" if len(reasons) > top else ""
    return f"{total:,} ({shown}{more})"


def curation_table(stats: dict[str, Any], title: str = "curation"):  # -> rich.table.Table
    """Documents in and out per block, and why they were dropped."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("block")
    table.add_column("in", justify="right")
    table.add_column("out", justify="right")
    table.add_column("dropped (top reasons)")
    table.add_column("notes")
    for entry in stats["blocks"]:
        table.add_row(
            entry["block"],
            f"{entry['documents_in']:,}",
            f"{entry['documents_out']:,}",
            summarize_drops(entry),
            _notes(entry),
        )
    return table


def _notes(entry: dict[str, Any]) -> str:
    notes = []
    if entry.get("changed"):
        notes.append(f"{entry['changed']:,} changed")
    if "clusters" in entry:
        notes.append(f"{entry['clusters']:,} clusters")
    if "distinct" in entry:
        notes.append(f"{entry['distinct']:,} distinct")
    if entry["block"] == "substring_dedup":
        notes.append(f"{entry['spans_removed']:,} spans ≥ {entry['min_span_words']} words, "
                     f"{entry['bytes_removed']:,} bytes cut")
    if "eval_ngrams" in entry:
        notes.append(f"{entry['eval_ngrams']:,} eval n-grams, {entry['docs_cut']:,} docs cut")
    return ", ".join(notes)


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


def empty_corpus_error(stats: dict[str, Any], where: str) -> ShoestringError:
    lines = [
        f"{e['block']}: {e['documents_in']:,} in, {e['documents_out']:,} out, "
        f"dropped {summarize_drops(e, top=5)}"
        for e in stats["blocks"]
    ]
    return ShoestringError(
        "curation removed every document:\n  " + "\n  ".join(lines),
        where=where,
        fix="loosen the block that removed them (e.g. --filters none, --dedup none, or "
        "--set curate.<threshold>=...), and see what a rule drops with --explain 5",
    )
