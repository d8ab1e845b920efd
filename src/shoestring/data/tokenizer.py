"""Tokenizers as standard Hugging Face `tokenizer.json` files: loaded, checked and laid out.

Three kinds: WordPiece (BERT-style encoders), byte-level BPE (GPT-style decoders: every byte
is representable, so there is no unknown token) and Unigram (SentencePiece-style). Prep trains
them (``shoestring.prep.tokenizer_training``) or loads an existing `tokenizer.json`.

Whatever the kind, the special tokens of the objective take the first ids, in a fixed order,
so the rest of shoestring can rely on them:

* MLM: ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4`` (``id < NUM_SPECIAL`` means "special");
* CLM: ``<|endoftext|>=0 <|pad|>=1``, plus ``<|unk|>=2`` for the kinds that need an unknown
  token (WordPiece, Unigram).

The rest of the vocabulary follows in a canonical order (see `_relayout`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, processors

from shoestring.config import TOKENIZER_KINDS
from shoestring.errors import ShoestringError
from shoestring.families import MLM, FamilySpec
from shoestring.families.spec import CLS, SEP


def load_for_objective(path: str | Path, family: FamilySpec) -> Tokenizer:
    """Load an existing ``tokenizer.json`` and give it the special-token layout of ``family``.

    Missing special tokens are added; tokens are renumbered (specials first, then the rest in
    their original id order) only when the layout differs. A model trained on it learns its
    own embeddings, so renumbering loses nothing.
    """
    tok = load_tokenizer(path)
    kind = tokenizer_kind(tok)
    if kind not in TOKENIZER_KINDS:
        raise ShoestringError(
            f"unsupported tokenizer model {kind!r}", where=str(path),
            fix="use a WordPiece, BPE or Unigram tokenizer.json, or let prep train one",
        )
    specials = family.special_tokens(kind)
    if _ids_of(tok, specials) == list(range(len(specials))):
        return finish(tok, family, kind, order=None)
    return finish(tok, family, kind, order="keep")


def finish(tok: Tokenizer, family: FamilySpec, kind: str, order: str | None) -> Tokenizer:
    """Lay the specials out first (``order``: canonical, keep, or None = leave ids) and set the
    post-processor of the family."""
    specials = family.special_tokens(kind)
    if order is not None:
        tok = _relayout(tok, specials, order)
    if family.row_frame:
        cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, cls_id), (SEP, sep_id)],
        )
    elif isinstance(tok.post_processor, processors.TemplateProcessing):
        tok.post_processor = None  # its ids may be stale; CLM adds no specials per sequence
    special_ids(tok, family)
    return tok


def _relayout(tok: Tokenizer, specials: list[str], order: str) -> Tokenizer:
    """The same tokenizer with ids: specials, then the rest in a fixed order.

    ``canonical`` (after training): the `tokenizers` trainers number tokens in hash-map order,
    so the same text gives different ids on every run (huggingface/tokenizers#1794). WordPiece
    segments by greedy longest match against the vocabulary *set*, BPE by its merge list (of
    strings) and Unigram by piece scores, so renumbering changes no segmentation and makes
    prep reproducible. Canonical is: WordPiece and Unigram sorted; BPE the alphabet sorted,
    then each merge's product in merge order (so a prefix of the vocabulary is meaningful).
    ``keep``: the rest in the existing id order (for loaded tokenizers).
    """
    data = json.loads(tok.to_str())
    model = data["model"]
    unigram = model["type"] == "Unigram"
    if unigram:
        scores = {piece: score for piece, score in model["vocab"]}
        old = [piece for piece, _ in model["vocab"]]
    else:
        old = sorted(model["vocab"], key=model["vocab"].get)
    added = [a["content"] for a in sorted(data.get("added_tokens") or [], key=lambda a: a["id"])]
    rest = [t for t in dict.fromkeys([*old, *added]) if t not in specials]
    if order == "canonical":
        rest = _bpe_order(model, rest) if model["type"] == "BPE" else sorted(rest)
    new = [*specials, *rest]
    ids = {t: i for i, t in enumerate(new)}
    if unigram:
        model["vocab"] = [[t, scores.get(t, 0.0)] for t in new]
        unk = old[model["unk_id"]] if model.get("unk_id") is not None else None
        model["unk_id"] = ids[unk] if unk is not None else None
    else:
        model["vocab"] = ids
    entries = {a["content"]: a for a in data.get("added_tokens") or []}
    for token in specials:
        entries.setdefault(token, {"content": token, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
        entries[token]["special"] = True
    for token, entry in entries.items():
        entry["id"] = ids[token]
    data["added_tokens"] = sorted(entries.values(), key=lambda a: a["id"])
    data["post_processor"] = None
    return Tokenizer.from_str(json.dumps(data))


def _bpe_order(model: dict[str, Any], tokens: list[str]) -> list[str]:
    prefix = model.get("continuing_subword_prefix") or ""
    products: list[str] = []
    for merge in model.get("merges") or []:
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        products.append(a + (b[len(prefix):] if prefix and b.startswith(prefix) else b))
    present = set(tokens)
    produced = [t for t in dict.fromkeys(products) if t in present]
    produced_set = set(produced)
    return sorted(t for t in tokens if t not in produced_set) + produced


def _ids_of(tok: Tokenizer, tokens: list[str]) -> list[int | None]:
    return [tok.token_to_id(t) for t in tokens]


def tokenizer_kind(tok: Tokenizer) -> str:
    """``wordpiece``, ``bpe``, ``unigram`` (or another model type, lowercased)."""
    return json.loads(tok.to_str())["model"]["type"].lower()


def special_ids(tok: Tokenizer, family: FamilySpec = MLM) -> dict[str, int]:
    """Special token → id, checked to be the fixed layout of ``family``."""
    names = family.special_tokens(tokenizer_kind(tok))
    ids = {name: tok.token_to_id(name) for name in names}
    if list(ids.values()) != list(range(len(names))):
        raise ShoestringError(
            f"tokenizer special tokens are not the first ids in order {names}: {ids}",
            fix="train the tokenizer with shoestring prep (or pass it as data.tokenizer=PATH, "
            "which lays the specials out)",
        )
    return ids


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path)
    if not p.is_file():
        raise ShoestringError("tokenizer.json not found", where=str(p),
                              fix="run shoestring prep, or check data.tokenizer")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises plain Exception on bad JSON
        raise ShoestringError(f"cannot load tokenizer ({e})", where=str(p)) from None
