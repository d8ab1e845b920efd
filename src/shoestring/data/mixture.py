"""Designed data mixtures: named sources, each a share of the training tokens.

A recipe (``data.mixture``; ``prep --mix``) names sources and gives each a *weight* (its share
of the training tokens, normalized) or *epochs* (passes over it relative to the others, as
Megatron-Turing NLG's corpus table gives them). A source is the documents of some inputs
(``files:``) or the documents whose JSON field ``mixture.field`` has a value (``value:``,
default the source's name), e.g. ``source`` in wiki-books-en.jsonl.zst.

Prep (`SourceMatcher`) gives every kept document a source, writes each split's documents
grouped by source so that each source packs into one contiguous range of sequences
(`source_ranges`; a sequence straddling two sources counts for the one it starts in), and
records per source its documents, tokens and range in the manifest.

The loader (`MixtureSampler`) draws each epoch — ``len(split)`` sequences, as without a
mixture — as ``round(weight × len(split))`` sequences of each source, taken from that source's
own stream of seeded permutations (so a source asking for more than it has is repeated, one
asking for less is subsampled and continues where it stopped in the next epoch), shuffled
together by (seed, epoch). The order of an epoch depends on (seed, epoch) only, so the
loader's cursor (epoch, offset) resumes it exactly and ranks slice it as before.

`epochs_at` is what a budget of tokens makes of each source; `budget_report` the lines
``plan`` and ``train`` print, with a warning past `REPEAT_WARN_EPOCHS` (`repetition`).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from shoestring.config import MixtureConfig
from shoestring.data.readers import Document
from shoestring.data.repetition import REPEAT_WARN_EPOCHS, SOURCE, repetition_cost
from shoestring.data.sources import resolve_sources
from shoestring.errors import ShoestringError
from shoestring.fsutil import read_yaml

_ORDER_SALT = 0x6D6978  # "mix": keeps these streams apart from the plain loader's


# --- the recipe ------------------------------------------------------------------------


def parse_mix(text: str, field: str | None = None) -> dict[str, Any]:
    """``prep --mix``: a YAML recipe file, or ``NAME=WEIGHT,…`` / ``NAME=EPOCHSx,…`` inline.

    Returns the ``data.mixture`` mapping, checked here — before any data is read — so that a
    bad recipe is one message naming ``--mix``, the source, the key and the value given
    (`_recipe_error`), not the config's generic list of dotted keys."""
    path = Path(os.path.expanduser(text))
    if text.endswith((".yaml", ".yml")) or path.is_file():
        tree = _read_recipe(path)
    else:
        tree = {"sources": _parse_inline(text)}
    if field is not None:
        tree["field"] = field
    try:
        MixtureConfig.model_validate(tree)
    except ValidationError as e:
        raise _recipe_error(e, text) from None
    return tree


def _recipe_error(err: ValidationError, spec: str) -> ShoestringError:
    """The recipe's problems as one ``--mix SPEC:`` message: each as ``source NAME: KEY``,
    what is wrong and the value given, with what to do about the first."""
    problems, keys = [], []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        key = loc[-1] if loc else ""
        keys.append(key)
        place = (f"source {loc[1]}" + (f": {key}" if len(loc) > 2 else "")
                 if loc[:1] == ["sources"] and len(loc) > 1 else
                 "--mix-field" if loc == ["field"] else "")
        if e["type"] == "extra_forbidden":
            what = f"unknown key {key!r}; the keys are epochs, files, value, weight"
            place = place.rsplit(": ", 1)[0]
        else:
            what = re.sub(r"^(Input|String) should", "should", e["msg"].removeprefix(
                "Value error, ").replace(", unable to parse string as a number", ""))
            if e["type"] == "model_type":
                what = "should be a number (its weight) or a mapping {weight|epochs, value|files}"
            value = e.get("input")
            if not isinstance(value, dict):
                what += f" (got {value!r})"
        sep = " " if what.startswith("should") else ": "
        problems.append(f"{place}{sep}{what}" if place else what)
    first = keys[0]
    fix = ("give each source a positive number: NAME=0.6 (its share of the training tokens) "
           "or NAME=2x (its epochs)" if first in ("weight", "epochs") else
           "--mix-field names the JSON field holding a document's source, e.g. source"
           if first == "field" else "see docs/data.md, Mixtures")
    return ShoestringError("; ".join(problems), where=f"--mix {spec}", fix=fix)


def _read_recipe(path: Path) -> dict[str, Any]:
    tree = read_yaml(path, "mixture recipe")
    if isinstance(tree, dict) and isinstance(tree.get("mixture"), dict):
        tree = tree["mixture"]  # a config-style file (`mixture:` at the top)
    if not isinstance(tree, dict) or not tree:
        raise ShoestringError(
            "a mixture recipe is a mapping: `sources:` (name → weight or {weight|epochs, "
            "value|files}) and optionally `field:`", where=str(path),
            fix="see docs/data.md, Mixtures")
    return dict(tree) if "sources" in tree else {"sources": dict(tree)}


def _parse_inline(text: str) -> dict[str, Any]:
    sources: dict[str, Any] = {}
    for item in (p.strip() for p in text.split(",")):
        name, sep, amount = (s.strip() for s in item.partition("="))
        if not (name and sep and amount):
            raise ShoestringError(
                f"mixture entry {item!r} is not NAME=WEIGHT or NAME=EPOCHSx", where="--mix",
                fix="e.g. --mix wikipedia=0.6,gutenberg=0.4 or --mix wikipedia=2x,gutenberg=1x, "
                "or the path of a .yaml recipe")
        key = "epochs" if amount.lower().endswith("x") else "weight"
        raw = amount[:-1] if key == "epochs" else amount
        try:
            value: Any = float(raw)
        except ValueError:
            value = raw  # validation names it with its field
        if name in sources:
            raise ShoestringError(f"source {name!r} is given twice", where="--mix")
        sources[name] = {key: value}
    return sources


def mixture_inputs(specs: list[str], mix: MixtureConfig | None) -> list[str]:
    """The inputs prep reads: ``specs``, then the ``files`` of sources that name files."""
    if mix is None:
        return list(specs)
    extra = [f for s in mix.sources.values() for f in (s.files or []) if f not in specs]
    return [*specs, *extra]


def _key(source: str) -> str:
    return source if ":" in source.split("/")[0] else os.path.abspath(source)


class SourceMatcher:
    """Which source of the recipe each document belongs to (files first, then field value)."""

    def __init__(self, mix: MixtureConfig) -> None:
        self.mix = mix
        self.names = list(mix.sources)
        self.by_file: dict[str, int] = {}
        self.by_value: dict[str, int] = {}
        for i, (name, src) in enumerate(mix.sources.items()):
            if src.files:
                for f in resolve_sources(src.files):
                    other = self.by_file.setdefault(_key(f), i)
                    if other != i:  # the later source would get none of its documents
                        raise ShoestringError(
                            f"sources {self.names[other]} and {name} both take the file "
                            f"{f}: a document belongs to one source",
                            where=f"data.mixture.sources.{name}",
                            fix="list each file (or glob match) under one source only")
            else:
                self.by_value[src.value or name] = i
        self.documents = [0] * len(self.names)
        self.values: Counter[str] = Counter()

    @property
    def label_field(self) -> str | None:
        """The JSON field readers must report (None when every source names files)."""
        return self.mix.field if self.by_value else None

    def index(self, doc: Document) -> int:
        """The source of ``doc``; a document the recipe does not place is an error."""
        i = self.by_file.get(_key(doc.source)) if self.by_file else None
        if i is None:
            i = self.by_value.get(doc.label)
            self.values[doc.label] += 1
        if i is None:
            got = (f"{self.mix.field}={doc.label!r}" if doc.label
                   else f"no '{self.mix.field}' field (fields are read from .jsonl/.json "
                   "files; give other inputs a source with files:)")
            raise ShoestringError(
                f"the document has {got}, which no source of data.mixture takes; the sources: "
                f"{self.describe()}", where=doc.doc_id,
                fix="add a source for it (data.mixture.sources.NAME, with value: or files:), "
                "or leave its input out")
        self.documents[i] += 1
        return i

    def describe(self) -> str:
        """The sources and what each takes, for errors."""
        parts = []
        for name, src in self.mix.sources.items():
            what = (f"files {', '.join(src.files)}" if src.files
                    else f"{self.mix.field}={src.value or name!r}")
            parts.append(f"{name} ({what})")
        return "; ".join(parts)

    def check_inputs(self, files: list[str]) -> None:
        """Before reading: the sources that take documents by field value need an input no
        ``files:`` source claims, or they would be found empty only after the whole read."""
        by_value = [n for n, s in self.mix.sources.items() if not s.files]
        if by_value and all(_key(f) in self.by_file for f in files):
            raise ShoestringError(
                ("source " if len(by_value) == 1 else "sources ") + ", ".join(by_value)
                + (" takes" if len(by_value) == 1 else " take") + " documents by their "
                f"'{self.mix.field}' field, but every input belongs to a source with files:",
                where=f"data.mixture.sources.{by_value[0]}",
                fix="give prep the inputs these documents are in (SOURCES), or give these "
                "sources files:")

    def check(self) -> None:
        """After reading: every source must have kept documents (a misspelt value has none)."""
        empty = [n for n, c in zip(self.names, self.documents) if c == 0]
        if not empty:
            return
        seen = ", ".join(f"{v!r} ({c:,})" for v, c in self.values.most_common(20) if v)
        name = empty[0]
        raise ShoestringError(
            f"data.mixture.sources.{name}: no kept document is in this source "
            f"({self.describe()}); the values of '{self.mix.field}' seen: {seen or 'none'}",
            where=f"data.mixture.sources.{name}",
            fix="use one of the values seen (value: VALUE, or name the source after it), "
            "or point the source at files")


# --- prep: per-source ranges -----------------------------------------------------------


def source_ranges(doc_ends: np.ndarray, documents: Sequence[int], body: int,
                  n_sequences: int) -> list[dict[str, Any]]:
    """Per source (documents grouped by source, ``documents[s]`` of source ``s`` in turn):
    its documents, document tokens (without separators) and range of sequences.

    ``doc_ends``: each document's end in the token stream (after its separator); sequence
    ``i`` holds the stream's tokens ``[i·body, (i+1)·body)`` and counts for the source of its
    first token."""
    out, first = [], 0
    for n_docs in documents:
        last = first + int(n_docs)
        start = int(doc_ends[first - 1]) if first else 0
        end = int(doc_ends[last - 1]) if last else 0
        lo = min(-(-start // body), n_sequences)
        hi = min(-(-end // body), n_sequences) if n_docs else lo
        out.append({"documents": int(n_docs), "document_tokens": end - start - int(n_docs),
                    "sequences": [lo, max(lo, hi)]})
        first = last
    return out


def source_weights(mix: MixtureConfig, train_tokens: dict[str, int]) -> dict[str, float]:
    """Each source's share of the training tokens: its weight, or epochs × its tokens,
    normalized to sum to 1."""
    raw = {n: (s.weight if s.weight is not None else float(s.epochs or 0) * train_tokens[n])
           for n, s in mix.sources.items()}
    total = sum(raw.values())
    return {n: v / total for n, v in raw.items()}


# --- budgets -----------------------------------------------------------------------------


def epochs_at(budget_tokens: float, sources: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Passes over each source's training tokens that ``budget_tokens`` of training make
    (``sources``: the manifest's ``mixture.sources``: ``weight`` and ``train_tokens``)."""
    return {n: (budget_tokens * s["weight"] / s["train_tokens"] if s["train_tokens"]
                else float("inf"))
            for n, s in sources.items()}


def budget_report(budget_tokens: float, sources: dict[str, dict[str, Any]]
                  ) -> tuple[list[str], list[str]]:
    """One line per source (share, tokens, epochs at the budget) and a warning per source
    repeated more than `REPEAT_WARN_EPOCHS` times, with what repetition costs it."""
    lines, warnings = [], []
    for name, epochs in epochs_at(budget_tokens, sources).items():
        s = sources[name]
        lines.append(f"{name}: {s['weight']:.1%} of training, {s['train_tokens']:,} train "
                     f"tokens → {epochs:.2f} epochs")
        if epochs > REPEAT_WARN_EPOCHS:
            cost = repetition_cost(s["train_tokens"], epochs)
            warnings.append(
                f"source {name} would be seen {epochs:.1f} times (over "
                f"{REPEAT_WARN_EPOCHS:g}): repetition wastes {cost:.0%} of its "
                f"{budget_tokens * s['weight']:,.0f} training tokens ({SOURCE}); add data "
                "to it, lower its weight, or shorten the budget")
    return lines, warnings


def manifest_sources(manifest: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The manifest's mixture sources (weight, train_tokens, …), or None without a mixture."""
    mixture = manifest.get("mixture")
    return dict(mixture["sources"]) if isinstance(mixture, dict) else None


# --- the loader's order ------------------------------------------------------------------


class MixtureSampler:
    """The order of a mixed split's epochs (see the module docstring)."""

    def __init__(self, ranges: Sequence[tuple[int, int]], weights: Sequence[float]) -> None:
        self.ranges = [(int(lo), int(hi)) for lo, hi in ranges]
        self.n = sum(hi - lo for lo, hi in self.ranges)
        self.counts = _apportion(np.asarray(weights, dtype=np.float64), self.n)
        self._passes: dict[tuple[int, int, int], np.ndarray] = {}

    @classmethod
    def of(cls, split: Any) -> MixtureSampler | None:
        """The sampler of a split whose manifest entry has weighted sources, else None."""
        sources = getattr(split, "sources", None)
        if not sources or any("weight" not in s for s in sources.values()):
            return None
        return cls([tuple(s["sequences"]) for s in sources.values()],
                   [s["weight"] for s in sources.values()])

    def order(self, seed: int, epoch: int) -> np.ndarray:
        """Global sequence indices of ``epoch``: each source's share, shuffled together."""
        parts = [lo + self._take(seed, s, epoch * k, k, hi - lo)
                 for s, ((lo, hi), k) in enumerate(zip(self.ranges, self.counts)) if k]
        picked = np.concatenate(parts)  # a fresh array: shuffled in place (half the time)
        np.random.default_rng([seed, epoch, _ORDER_SALT]).shuffle(picked)
        return picked

    def _take(self, seed: int, source: int, start: int, count: int, size: int) -> np.ndarray:
        """Entries ``[start, start+count)`` of the source's endless stream of permutations."""
        parts, pos = [], start
        while pos < start + count:
            pass_, off = divmod(pos, size)
            perm = self._pass(seed, source, pass_, size)
            piece = perm[off: off + start + count - pos]
            parts.append(piece)
            pos += len(piece)
        return np.concatenate(parts)

    def _pass(self, seed: int, source: int, pass_: int, size: int) -> np.ndarray:
        key = (seed, source, pass_)
        perm = self._passes.get(key)
        if perm is None:
            perm = np.random.default_rng([seed, _ORDER_SALT, source, pass_]).permutation(size)
            self._passes = {k: v for k, v in self._passes.items()
                            if k[1] != source or k[2] >= pass_ - 1}
            self._passes[key] = perm
        return perm


def _apportion(weights: np.ndarray, n: int) -> list[int]:
    """``n`` split in proportion to ``weights`` (largest remainder: exact sum, each share
    within one of weight × n)."""
    exact = weights / weights.sum() * n
    counts = np.floor(exact).astype(np.int64)
    short = n - int(counts.sum())
    for i in np.argsort(-(exact - counts), kind="stable")[:short]:
        counts[i] += 1
    return [int(c) for c in counts]
