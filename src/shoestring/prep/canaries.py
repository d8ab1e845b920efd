"""Canaries: random secrets planted in the training split, for `shoestring audit`.

The "secret sharer" test (Carlini et al. 2019): insert a sentence with a random secret into
the training data ``R`` times, then ask how much more likely the trained model finds the
true secret than random candidates of the same form. ``K`` more canaries are generated the
same way but never inserted: their scores are what chance looks like.

A canary is ``CONTEXT_WORDS`` random words, then ``my secret number is`` and
``SECRET_DIGITS`` random digits separated by spaces (each digit one token under every
tokenizer shoestring trains). At 50 words it is as long as substring dedup's default span,
so the dedup experiment can remove its repeats; whole-document dedup cannot, because each
copy is written into a different training document (at a line break near its middle).

Copies go into the stream before curation, so dedup sees them; the documents holding them
are kept in the training split whatever their content hash. ``canaries.json`` in the data
dir lists the inserted canaries (with how many copies survived curation) and the references.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shoestring.prep.curate.blocks import Block
from shoestring.data.sources import Document
from shoestring.fsutil import write_json_atomic

if TYPE_CHECKING:
    from shoestring.config import CurateConfig

FILE = "canaries.json"
CONTEXT_WORDS = 45
SECRET_DIGITS = 6
LEAD = "my secret number is"
# Plain lowercase words: one or two tokens each under WordPiece and BPE, never a digit.
_WORDS = (
    "apple river stone cloud garden window silver orange forest candle mirror bridge "
    "paper hammer rabbit winter summer yellow purple marble lantern pocket ladder basket "
    "pencil violin tunnel meadow harbor castle rocket saddle turtle island valley spider "
    "copper blanket cotton engine feather helmet jacket kettle lemon magnet needle "
    "oyster parrot pepper quilt ribbon shadow thunder velvet wagon walnut zipper anchor "
    "button cactus dragon falcon ginger honey iceberg jungle koala"
).split()


@dataclass(frozen=True)
class Canary:
    """One canary: ``prefix`` (context + lead) followed by the secret digits."""

    id: str
    context: str
    secret: str  # digits separated by single spaces
    inserted: int = 0
    in_train: int = 0  # copies found in the training split after curation

    @property
    def prefix(self) -> str:
        return f"{self.context} {LEAD}"

    @property
    def text(self) -> str:
        return f"{self.prefix} {self.secret}"


def random_secret(rng: np.random.Generator) -> str:
    return " ".join(str(d) for d in rng.integers(0, 10, SECRET_DIGITS))


def make_canaries(k: int, seed: int) -> tuple[list[Canary], list[Canary]]:
    """``k`` canaries to insert and ``k`` references never inserted, from one seed."""
    rng = np.random.default_rng([seed, 0xCA4A])

    def one(name: str) -> Canary:
        context = " ".join(rng.choice(_WORDS, CONTEXT_WORDS))
        return Canary(name, context, random_secret(rng))

    inserted = [one(f"canary-{i}") for i in range(k)]
    references = [one(f"reference-{i}") for i in range(k)]
    return inserted, references


def embed(host: str, line: str) -> str:
    """``host`` with ``line`` on its own line at the line break nearest its middle (or at the
    end when it has none)."""
    mid = len(host) // 2
    breaks = [i for i in (host.rfind("\n", 0, mid), host.find("\n", mid)) if i > 0]
    if not breaks:
        return f"{host}\n{line}"
    at = min(breaks, key=lambda i: abs(i - mid))
    return f"{host[:at]}\n{line}{host[at:]}"


class Canaries(Block):
    """Block ``canaries``: ``repeats`` copies of each canary written into successive documents,
    one copy per document, in a seeded shuffled order; copies left when the stream ends become
    documents of their own. ``hosts`` are the doc ids that carry a copy (the split keeps them
    in train). After the split, `finish` counts the copies that reached train and writes
    ``canaries.json``; the block's record says what was planted and what survived."""

    name = "canaries"

    def __init__(self, count: int, repeats: int | list[int], seed: int) -> None:
        super().__init__()
        self.canaries, self.references = make_canaries(count, seed)
        self.repeats = repeats  # a list cycles over the canaries: several counts in one corpus
        self.seed = seed
        self.hosts: set[str] = set()
        self.in_train = [0] * count

    @classmethod
    def from_config(cls, cfg: CurateConfig | None) -> Canaries | None:
        """``prep --canaries K``'s block; None when off."""
        return None if cfg is None or not cfg.canaries else cls(
            cfg.canaries, cfg.canary_repeats, cfg.canary_seed)

    def copies(self) -> list[int]:
        """Copies of each canary."""
        r = self.repeats if isinstance(self.repeats, list) else [self.repeats]
        return [r[i % len(r)] for i in range(len(self.canaries))]

    def process(self, docs: Iterable[Document]) -> Iterator[Document]:
        order = np.repeat(np.arange(len(self.canaries)), self.copies())
        np.random.default_rng([self.seed, 0xC0DE]).shuffle(order)
        pending = [self.canaries[int(i)] for i in order]
        for doc in docs:
            if pending:
                c = pending.pop()
                self.hosts.add(doc.doc_id)
                doc = replace(doc, text=embed(doc.text, c.text))
            yield doc
        for n, c in enumerate(reversed(pending)):
            doc_id = f"{c.id}#standalone-{n}"
            self.hosts.add(doc_id)
            yield Document(c.text, "canaries", doc_id)

    def finish(self, folder: Path, train: Iterable[str]) -> None:
        """Count the copies in the training texts (curation may cut some) and write
        ``canaries.json`` in ``folder``."""
        self.in_train = count_in(train, self.canaries)
        planted = [replace(c, inserted=r, in_train=n)
                   for c, r, n in zip(self.canaries, self.copies(), self.in_train)]
        write(folder / FILE, planted, self.references, self.repeats, self.seed)

    def report(self) -> dict[str, Any]:
        return {"block": self.name, "canaries": len(self.canaries),
                "references": len(self.references), "copies_inserted": sum(self.copies()),
                "copies_in_train": sum(self.in_train), "file": FILE}


def count_in(texts: Iterable[str], canaries: list[Canary]) -> list[int]:
    """How many copies of each canary the texts hold."""
    counts = [0] * len(canaries)
    for text in texts:
        if "secret" not in text:
            continue
        for i, c in enumerate(canaries):
            counts[i] += text.count(c.text)
    return counts


def write(path: Path, inserted: list[Canary], references: list[Canary], repeats: int | list[int],
          seed: int) -> dict[str, Any]:
    record = {
        "format": "shoestring-canaries-1",
        "repeats": repeats,
        "seed": seed,
        "secret_digits": SECRET_DIGITS,
        "canaries": [asdict(c) | {"prefix": c.prefix} for c in inserted],
        "references": [asdict(c) | {"prefix": c.prefix} for c in references],
    }
    write_json_atomic(path, record)
    return record


def read(path: Path) -> tuple[list[Canary], list[Canary], dict[str, Any]]:
    import json

    record = json.loads(Path(path).read_text(encoding="utf-8"))
    fields = set(Canary.__dataclass_fields__)

    def load(items: list[dict]) -> list[Canary]:
        return [Canary(**{k: v for k, v in c.items() if k in fields}) for c in items]

    return load(record["canaries"]), load(record["references"]), record
