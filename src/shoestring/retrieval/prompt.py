"""The retrieval-augmented prompt, fitted into the decoder's context length.

Layout: each passage as ``[n] (document id, folders dropped) text`` on its own lines, best first, then
``Question: …`` and ``Answer:``. Truncation policy, in this order:

1. The context is the decoder's training sequence length; ``max_new_tokens`` of it are kept
   free for the answer, and one token for the <|endoftext|> the engine puts before a prompt.
2. The question and the template around it are never cut: if they alone do not fit, that is
   an error (shorten the question or ask for fewer new tokens).
3. Passages go in by rank while they fit whole. The first one that does not fit is cut to the
   tokens left (at a token boundary) when at least ``MIN_PASSAGE_TOKENS`` are left; it and
   every lower-ranked passage are dropped otherwise. Which passages were used, and whether
   the last was cut, is reported with the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoestring.errors import ShoestringError
from shoestring.retrieval.index import Hit

MIN_PASSAGE_TOKENS = 16
PROMPT_PREFIX_TOKENS = 1  # the <|endoftext|> the decoder engine puts before every prompt


@dataclass(frozen=True)
class RagPrompt:
    text: str
    tokens: int  # prompt tokens, the engine's prefix token included
    used: list[Hit]  # passages in the prompt, in order
    truncated: bool  # the last used passage was cut


def _block(n: int, hit: Hit, text: str) -> str:
    # The file name, not its path: a path costs a small model's context many tokens (the
    # answer lists each passage's full source and offset).
    p = hit.passage
    where = p.doc_id.replace(str(Path(p.source).parent) + "/", "")
    return f"[{n}] ({where}) {' '.join(text.split())}\n"


def _question(question: str) -> str:
    return f"Question: {question.strip()}\nAnswer:"


def build_prompt(question: str, hits: list[Hit], tokenizer: Any, context: int,
                 max_new_tokens: int) -> RagPrompt:
    """The prompt for ``question`` with as many of ``hits`` as ``context`` allows (policy in
    the module docstring); ``tokenizer`` is the decoder's (a ``tokenizers.Tokenizer``)."""
    def count(text: str) -> int:
        return len(tokenizer.encode(text).ids)  # as the serving engine tokenizes a prompt

    budget = context - max_new_tokens - PROMPT_PREFIX_TOKENS
    tail = _question(question)
    left = budget - count(tail)
    if left < 0:
        raise ShoestringError(
            f"the question takes {count(tail)} tokens, but the decoder's context of {context} "
            f"tokens leaves {budget} after {max_new_tokens} new tokens",
            where="question",
            fix="shorten the question, or lower --max-new-tokens")
    parts: list[str] = []
    used: list[Hit] = []
    truncated = False
    for hit in hits:
        block = _block(len(used) + 1, hit, hit.passage.text)
        need = count(block)
        if need <= left:
            parts.append(block)
            used.append(hit)
            left -= need
            continue
        head = count(_block(len(used) + 1, hit, "")) + 1  # the label, and the newline
        room = left - head
        if room >= MIN_PASSAGE_TOKENS:
            text = " ".join(hit.passage.text.split())
            enc = tokenizer.encode(text)
            cut = text[:enc.offsets[room - 1][1]] if room <= len(enc.ids) else text
            block = _block(len(used) + 1, hit, cut)
            while count(block) > left and cut:  # merges across the cut can add a token
                cut = cut[:-1]
                block = _block(len(used) + 1, hit, cut)
            parts.append(block)
            used.append(hit)
            truncated = True
        break
    text = "".join(parts) + tail
    while count(text) > budget and parts:  # token merges across blocks (rare): cut further
        parts[-1] = parts[-1][:-2] + "\n"
        truncated = True
        if len(parts[-1]) <= 1:
            parts.pop()
            used.pop()
        text = "".join(parts) + tail
    return RagPrompt(text, count(text) + PROMPT_PREFIX_TOKENS, used, truncated)
