"""Does the tokenizer need more than ``data.tokenizer_sample_chars`` of text? Tokens per
character on held-out text under tokenizers trained on samples of several sizes.

The texts are a corpus's ``.jsonl.zst`` shards (by default the 1.4 GB corpus of
``bench/prep_scale.py``); about 1% of the documents (by content hash) are held out; each
tokenizer learns from `shoestring.prep.tokenizer_training.tokenizer_sample` of the rest (prep's own
uniform draw) with prep's defaults (WordPiece for mlm, ``data.vocab_size``, lowercased),
each in a fresh process (its peak RSS and seconds are printed beside it). Fewer tokens per
character on the held-out text is a better fit; when a larger sample no longer lowers it,
the sample is large enough.

    python bench/tokenizer_sample_size.py --mib 64,256,1024
"""

from __future__ import annotations

from argparse import SUPPRESS

import hashlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import scale_corpus as SC  # noqa: E402
from common import Bench, parser  # noqa: E402

DEFAULT = Path("/work/scale-cache/wb-1.4gb-s0-n0.03-e0.01-j0.7_0.95-g5-v2/shards")
HELD_OUT = 0.01


def held_out(text: str) -> bool:
    h = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8, person=b"held-out")
    return int.from_bytes(h.digest(), "little") / 2**64 < HELD_OUT


def texts(shards: Path, held: bool):
    for path in sorted(shards.glob("*.jsonl.zst")):
        for rec in SC.read_jsonl(path):
            if held_out(rec["text"]) == held:
                yield rec["text"]


def one(shards: Path, mib: int, total: int, vocab: int) -> dict:
    from shoestring.families import MLM
    from shoestring.prep.tokenizer_training import tokenizer_sample, train_tokenizer

    cap = mib << 20
    seen = {"chars": 0}

    def sample():
        seen["chars"] = 0
        for t in tokenizer_sample(texts(shards, False), cap, total):
            seen["chars"] += len(t)
            yield t

    t0 = time.perf_counter()
    tok = train_tokenizer(sample, "wordpiece", MLM, vocab, True)
    train_s = time.perf_counter() - t0
    tokens = chars = unk = 0
    unk_id = tok.token_to_id("[UNK]")
    batch: list[str] = []
    for t in [*texts(shards, True), None]:
        if t is not None:
            batch.append(t)
        if batch and (t is None or len(batch) == 256):
            for enc, s in zip(tok.encode_batch(batch, add_special_tokens=False), batch):
                tokens += len(enc.ids)
                unk += enc.ids.count(unk_id)
                chars += len(s)
            batch = []
    return {"mib": mib, "sample_chars": seen["chars"], "train_s": round(train_s, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3, 1),
            "held_out_chars": chars, "tokens_per_char": round(tokens / chars, 5),
            "unk_per_1k_tokens": round(1e3 * unk / tokens, 3)}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--shards", type=Path, default=DEFAULT)
    ap.add_argument("--mib", default="64,256,1024")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", type=int, help=SUPPRESS)
    ap.add_argument("--total", type=int, help=SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.shards, args.one, args.total, args.vocab)))
        return
    bench = Bench("tokenizer_sample_size", args)
    total = sum(len(t) for t in texts(args.shards, False))
    print(f"{args.shards}: {total:,} characters to draw from, ~{HELD_OUT:.0%} held out", flush=True)
    rows = []
    for mib in [int(m) for m in args.mib.split(",")]:
        out = subprocess.run([sys.executable, __file__, "--shards", str(args.shards), "--one",
                              str(mib), "--total", str(total), "--vocab", str(args.vocab)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps({"shards": str(args.shards), "total_chars": total,
                                         "vocab": args.vocab, "rows": rows}, indent=1))
    bench.table(rows, formats={"tokens_per_char": ".4f", "unk_per_1k_tokens": ".3f"})
    bench.end()


if __name__ == "__main__":
    main()
