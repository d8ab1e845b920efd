"""The block protocol: one small, separately testable step of curation (datatrove style).

A block takes a stream of documents and yields the ones it keeps (possibly changed, or,
for decontamination's cut mode, split into pieces). Every block counts documents in and
out and drops per reason, and remembers the first ``keep_examples`` dropped documents per
reason so ``--explain N`` can show a user what a rule removes.

Most blocks judge one document at a time: they implement ``apply(doc)``, returning the
document (the same or changed) or a ``Drop(reason, detail)``. Blocks that need to see many
documents at once (fuzzy dedup hashes a batch together) or emit several documents per
input override ``process`` instead and keep the same counters.

Stateless blocks (``stateful = False``) can run in several processes, their records merged
(the Ray executor's ``stages.merge_reports``); dedup blocks hold an index of what they have
seen and must see the whole stream in one process.

Prep's own steps are blocks too: the reader (``sources.Read``) → clean
(``normalize.Clean``) → canaries (``canaries.Canaries``) → these curation blocks → the
split writer (``driver.Split``); each one's ``report()`` is its record in the manifest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shoestring.data.sources import Document

EXCERPT_CHARS = 600


@dataclass(frozen=True)
class Drop:
    """Why a block removed a document: a short ``reason`` key and a human ``detail``."""

    reason: str
    detail: str = ""
    of: str = ""  # the document this one repeats, where the block knows it (dedup)


@dataclass(frozen=True)
class Example:
    """A dropped document kept for ``--explain``: where it came from, why, and its start."""

    doc_id: str
    reason: str
    detail: str
    excerpt: str
    chars: int


@dataclass
class BlockStats:
    """Counts of one block; ``to_dict`` is what the manifest records.

    The record's keys (``block``, ``documents_in``, ``documents_out``, ``dropped``: reason →
    count) are the ones every prep stage uses in ``manifest["blocks"]``.
    """

    name: str
    docs_in: int = 0
    docs_out: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    changed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "block": self.name,
            "documents_in": self.docs_in,
            "documents_out": self.docs_out,
            "dropped": dict(sorted(self.dropped.items(), key=lambda kv: (-kv[1], kv[0]))),
        }
        if self.changed:
            out["changed"] = self.changed
        out.update(self.extra)
        return out


class Block:
    """Base class: counters, examples, and a ``process`` built on ``apply``."""

    name: ClassVar[str] = "block"
    stateful: ClassVar[bool] = False

    def __init__(self, keep_examples: int = 0) -> None:
        self.keep_examples = keep_examples
        self.stats = BlockStats(self.name)
        self.examples: dict[str, list[Example]] = {}
        # told (doc_id, block name, the document it repeats or "") of every drop
        # (curate.dropped_ids); set by the Curator
        self.on_drop: Callable[[str, str, str], None] | None = None

    def apply(self, doc: Document) -> Document | Drop:
        """Judge one document: return it (maybe changed) or a ``Drop``.

        The default ``process`` calls this per document; blocks that judge whole streams
        (fuzzy dedup, decontamination) override ``process`` instead and never reach here.
        """
        raise TypeError(f"{type(self).__name__} must define apply() or override process()")

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        """Yield the documents this block keeps, counting everything."""
        stats = self.stats
        for doc in docs:
            stats.docs_in += 1
            result = self.apply(doc)
            if isinstance(result, Drop):
                self.record_drop(doc, result)
                continue
            if result is not doc and result.text != doc.text:
                stats.changed += 1
            stats.docs_out += 1
            yield result

    def __call__(self, docs: Iterable[Document]) -> Iterator[Document]:
        return self.process(docs)

    def record_drop(self, doc: Document, drop: Drop) -> None:
        """Count a drop, tell ``on_drop``, and keep the document as an example while there
        is room. Every block reports its drops here, so the drop list costs no memory."""
        self.stats.dropped[drop.reason] += 1
        if self.on_drop is not None:
            self.on_drop(doc.doc_id, self.name, drop.of)
        if self.keep_examples:
            kept = self.examples.setdefault(drop.reason, [])
            if len(kept) < self.keep_examples:
                kept.append(
                    Example(
                        doc_id=doc.doc_id,
                        reason=drop.reason,
                        detail=drop.detail,
                        excerpt=doc.text[:EXCERPT_CHARS],
                        chars=len(doc.text),
                    )
                )

    def report(self) -> dict[str, Any]:
        """This block's manifest entry (subclasses add figures such as cluster counts)."""
        return self.stats.to_dict()
