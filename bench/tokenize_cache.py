"""The served encoder's tokenizing: the Rust library against the cached WordPiece path.

What `shoestring.inference.engine.Engine.tokenize` costs per text, in CPU time of the calling
thread with ``TOKENIZERS_PARALLELISM=false`` (one thread: the whole cost, not spread over a
pool), for the library's ``encode_batch_fast`` and for `shoestring.inference.wordpiece_cache`
(printable-ASCII texts word by word from a cache, the rest through the library), on the same
texts, in batches of 16 as the server's worker sees them, interleaved, best of 5 passes.
Each corpus is also checked for equal ids, text by text.

    python bench/tokenize_cache.py

Then the cache's memory as it fills, from 1,024 words to its bound (`MAX_WORDS`, when it is
emptied): the corpora's words, then random lower-case words, measured with tracemalloc.

Corpora: the bench's serving sentences (bench/serve_load.py's, with ``[MASK]`` in each),
builtin:pydocs documents cut to 512 characters, and where it is present the shared
mixed-en.jsonl (its first 4,000 documents, cut the same way). The tokenizer is a WordPiece
trained on builtin:pydocs (uncased, 8,192 pieces), as `shoestring prep` trains one.
"""

from __future__ import annotations

import json
import os
import random
import time
import tracemalloc

os.environ["TOKENIZERS_PARALLELISM"] = "false"

from common import SHARED, Bench, parser  # noqa: E402
from serve_load import make_texts  # noqa: E402
from shoestring.data.builtin import iter_pydocs  # noqa: E402
from shoestring.inference.wordpiece_cache import MAX_WORDS, WordPieceCache  # noqa: E402
from shoestring.prep.tokenizer_training import train_wordpiece  # noqa: E402

BATCH = 16


def corpora() -> dict[str, list[str]]:
    docs = [d.text for _, d in zip(range(3000), iter_pydocs())]
    out = {"serving sentences": make_texts(600), "pydocs (512 chars)": [d[:512] for d in docs]}
    mixed = SHARED / "corpora" / "mixed-en.jsonl"
    if mixed.is_file():
        with mixed.open(encoding="utf-8") as f:
            out["mixed-en (512 chars)"] = [json.loads(line)["text"][:512]
                                           for _, line in zip(range(4000), f)]
    else:
        print(f"mixed-en.jsonl not found at {mixed}: that corpus is left out")
    return out


def per_text(encode, texts: list[str], passes: int = 5) -> float:
    """Best CPU seconds per text over ``passes`` passes in batches of `BATCH`."""
    best = float("inf")
    for _ in range(passes):
        t = time.thread_time()
        for i in range(0, len(texts), BATCH):
            encode(texts[i:i + BATCH])
        best = min(best, time.thread_time() - t)
    return best / len(texts)


def main() -> None:
    args = parser(__doc__).parse_args()
    bench = Bench("tokenize_cache", args, precision="n/a")
    docs = [d.text for _, d in zip(range(2000), iter_pydocs())]
    tok = train_wordpiece(docs, vocab_size=8192)
    cache = WordPieceCache.for_tokenizer(tok)
    assert cache is not None, "the trained tokenizer's layout should take the cached path"
    library = lambda texts: [e.ids for e in tok.encode_batch_fast(texts)]  # noqa: E731
    rows = []
    for name, texts in corpora().items():
        same = cache.encode(texts) == library(texts)
        common = sum(map(cache.common, texts)) / len(texts)
        lib, cached = per_text(library, texts), per_text(cache.encode, texts)
        chars = sum(map(len, texts)) / len(texts)
        print(f"{name}: {len(texts)} texts, {chars:.0f} chars on average, {common:.1%} on the "
              f"cached path; library {lib * 1e6:.1f} us/text, cached {cached * 1e6:.1f} us/text "
              f"({lib / cached:.1f}x); ids equal: {same}")
        rows.append({"corpus": name, "texts": len(texts), "chars/text": chars,
                     "cached path": f"{common:.1%}", "library us/text": lib * 1e6,
                     "cached us/text": cached * 1e6, "speed-up": lib / cached,
                     "ids equal": same})
    bench.table(rows, formats={"chars/text": ".0f", "library us/text": ".1f",
                               "cached us/text": ".1f", "speed-up": ".1f"})
    bench.table(cache_memory(tok, [t for texts in corpora().values() for t in texts]),
                name="memory", formats={"MB": ".2f", "bytes/word": ".0f"})
    bench.end()


def cache_memory(tok, texts: list[str]) -> list[dict]:
    """The cache's size (tracemalloc: what filling it allocated and kept) at 1,024 words, a
    decade more, and its bound."""
    rng = random.Random(0)
    words = list(dict.fromkeys(w for t in texts for w in t.lower().split() if w.isalpha()))
    while len(words) < MAX_WORDS:
        words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                             for _ in range(rng.randint(3, 12))))
    rows = []
    for n in (1024, 10240, MAX_WORDS - 1):
        cache = WordPieceCache.for_tokenizer(tok)
        tracemalloc.start()
        for i in range(0, n, 512):
            cache.encode([" ".join(words[i:min(n, i + 512)])])
        kept, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        size = len(cache._pieces)
        print(f"cache of {size:,} words: {kept / 2**20:.2f} MB ({kept / size:.0f} bytes/word)")
        rows.append({"words": size, "MB": kept / 2**20, "bytes/word": kept / size})
    return rows


if __name__ == "__main__":
    main()
