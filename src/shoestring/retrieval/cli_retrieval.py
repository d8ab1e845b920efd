"""The bodies of `shoestring index`, `search` and `ask`: build an index, print the passages a
query finds, answer a question from them; what each prints."""

from __future__ import annotations

import json
from pathlib import Path

from shoestring.consoles import err, out
from shoestring.retrieval.index import RetrievalIndex, build_index, check_query
from shoestring.units import counted


def index(sources: list[str], output: Path, *, encoder: Path | None, passage_words: int,
          text_field: str, split_on: str, overwrite: bool) -> None:
    """Index ``sources`` into ``output`` (only what changed is rebuilt) and say what it holds."""
    manifest = build_index(sources, output, encoder=encoder, passage_words=passage_words,
                           text_field=text_field, split_on=split_on, overwrite=overwrite,
                           announce=lambda m: err.print(m, markup=False, highlight=False))
    done = ", ".join(manifest["rebuilt"]) or "nothing (up to date)"
    dense = f", dense {manifest['encoder']['dim']}-dim" if manifest["encoder"] else ""
    out.print(f"{output}: {counted(manifest['passages'], 'passage')} from "
              f"{counted(manifest['documents'], 'document')} (BM25{dense}); built: {done}",
              markup=False, highlight=False)


def _open(index_dir: Path, encoder: Path | None, mode: str) -> tuple[RetrievalIndex, str]:
    """The index and the mode to search it by: hybrid falls back to BM25 on an index with no
    dense vectors when no encoder is given."""
    idx = RetrievalIndex(index_dir, encoder=encoder)
    return idx, mode if idx.has_dense or mode != "hybrid" or encoder else "bm25"


def search(index_dir: Path, query: str, *, k: int, mode: str, encoder: Path | None,
           as_json: bool) -> None:
    """Print the ``k`` best passages for ``query`` (as JSON lines with ``as_json``)."""
    check_query(query, "QUERY")
    idx, mode = _open(index_dir, encoder, mode)
    for h in idx.search(query, k, mode, "QUERY"):
        if as_json:
            out.print(json.dumps(h.to_dict(), ensure_ascii=False), markup=False, highlight=False,
                      soft_wrap=True)
            continue
        text = " ".join(h.passage.text.split())
        out.print(f"{h.rank}. [{h.score:.4g}] {h.passage.cite}\n   {text[:300]}"
                  + ("…" if len(text) > 300 else ""), markup=False, highlight=False)


def ask(run: Path, question: str, *, index_dir: Path, k: int, mode: str, encoder: Path | None,
        max_new_tokens: int, temperature: float, top_k: int | None, seed: int) -> None:
    """Print the decoder's answer to ``question``, then (on stderr) the decoding and the
    passages its context held."""
    from shoestring.eval.causal_lm import describe_decoding
    from shoestring.inference.engine import load_engine
    from shoestring.retrieval.ask import ask as answer
    from shoestring.retrieval.ask import check_decoder
    from shoestring.retrieval.passages import Passage

    check_query(question, "QUESTION")
    engine = load_engine(run, max_length=1 << 20)
    check_decoder(engine, str(run))
    idx, mode = _open(index_dir, encoder, mode)
    result = answer(engine, idx, question, k=k, mode=mode, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_k=top_k, seed=seed)
    out.print(result["answer"] or "(empty answer)", markup=False, highlight=False)
    err.print(f"decoding: {describe_decoding(temperature, top_k, seed)}", markup=False,
              highlight=False)
    cut = " (the last one cut to fit)" if result["truncated"] else ""
    err.print(f"\npassages used ({len(result['passages'])} of {k} retrieved by {mode}{cut}; "
              f"prompt {result['prompt_tokens']} of {result['context']} tokens):",
              markup=False, highlight=False)
    for p in result["passages"]:
        err.print(f"{p['rank']}. {Passage(p['source'], p['doc_id'], p['offset'], '').cite}: "
                  f"{' '.join(p['text'].split())[:200]}", markup=False, highlight=False)
