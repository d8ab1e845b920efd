"""WordPiece tokenizers for encoders, trained and stored with Hugging Face `tokenizers`.

The saved `tokenizer.json` is the standard format, so `transformers` and any other
`tokenizers` user loads it as is. The special tokens take the first ids in a fixed order,
which lets the rest of shoestring treat "id < NUM_SPECIAL" as "special".
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from shoestring.errors import ShoestringError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]
NUM_SPECIAL = len(SPECIAL_TOKENS)


def train_wordpiece(
    texts: Iterable[str], vocab_size: int, lowercase: bool = True, length: int | None = None
) -> Tokenizer:
    """Train a BERT-style WordPiece tokenizer on ``texts``."""
    tok = Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(_nonempty(texts), trainer=trainer, length=length)
    if tok.get_vocab_size() <= NUM_SPECIAL:
        raise ShoestringError(
            "the tokenizer learned no vocabulary: the training text is empty",
            fix="give prep a corpus with some text in it",
        )
    tok.model = _canonical_wordpiece(tok.get_vocab())
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}",
        pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
        special_tokens=[(CLS, cls_id), (SEP, sep_id)],
    )
    return tok


def _canonical_wordpiece(vocab: dict[str, int]) -> models.WordPiece:
    """The same vocabulary with ids in a fixed order: specials, then sorted tokens.

    The `tokenizers` trainer numbers tokens in hash-map order, so the same text gives
    different ids on every run (huggingface/tokenizers#1794). WordPiece segments by greedy
    longest match against the vocabulary *set*, so renumbering changes no segmentation and
    makes prep reproducible.
    """
    rest = sorted(t for t in vocab if t not in SPECIAL_TOKENS)
    ordered = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *rest])}
    return models.WordPiece(
        ordered, unk_token=UNK, max_input_chars_per_word=100, continuing_subword_prefix="##"
    )


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    return (t for t in texts if t)


def special_ids(tok: Tokenizer) -> dict[str, int]:
    ids = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
    if list(ids.values()) != list(range(NUM_SPECIAL)):
        raise ShoestringError(
            f"tokenizer special tokens are not the first ids in order {SPECIAL_TOKENS}: {ids}",
            fix="train the tokenizer with shoestring prep",
        )
    return ids


def load_tokenizer(path: str | Path) -> Tokenizer:
    p = Path(path)
    if not p.is_file():
        raise ShoestringError("tokenizer.json not found", where=str(p), fix="run shoestring prep")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # tokenizers raises plain Exception on bad JSON
        raise ShoestringError(f"cannot load tokenizer ({e})", where=str(p)) from None


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
