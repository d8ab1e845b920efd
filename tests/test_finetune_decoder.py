"""Decoder evals on a tiny real CausalLM: perplexity, zero-shot multiple choice, greedy samples."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from shoestring.config import ModelConfig
from shoestring.errors import ShoestringError
from shoestring.eval.causal_lm import (
    encode_pair,
    greedy_samples,
    multiple_choice,
    perplexity,
    pick_choices,
    read_choices,
)
from shoestring.model.decoder import CausalLM
from shoestring.device import select_device

TEXT = "the cat sat on the mat . the dog ran in the park . "
EOS, PAD = "<|endoftext|>", "<|pad|>"


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory):
    """A byte-level BPE tokenizer and a tiny decoder trained to memorise two sentences."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([TEXT] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS, PAD], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("clmtok") / "tokenizer.json"
    tok.save(str(path))
    cfg = ModelConfig(objective="clm", hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
    torch.manual_seed(0)
    model = CausalLM(cfg, tok.get_vocab_size())
    ids = torch.tensor(tok.encode(TEXT * 4).ids)[None]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(80):
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    meta = {"architecture": "shoestring-clm", "model": cfg.model_dump(mode="json"),
            "vocab_size": tok.get_vocab_size(), "seq_len": 32,
            "special_ids": {EOS: tok.token_to_id(EOS), PAD: tok.token_to_id(PAD)}}
    return model, tok, path, meta


def test_perplexity_matches_a_direct_computation(lm) -> None:
    model, tok, _, meta = lm
    dev = select_device("fp32", measure_peak=False)
    eos = meta["special_ids"][EOS]
    docs = ["the cat sat on the mat .", "the dog ran in the park ."]
    stream = tok.encode(docs[0]).ids + [eos] + tok.encode(docs[1]).ids + [eos]
    ids = torch.tensor(stream)
    with torch.no_grad():
        nll = F.cross_entropy(model(ids[None, :-1])[0], ids[1:], reduction="sum").item()
    one = perplexity(model, tok, docs, seq_len=len(stream), eos_id=eos, device=dev)
    assert one["tokens"] == len(stream) - 1
    assert one["loss"] == pytest.approx(nll / (len(stream) - 1), rel=1e-5)
    assert one["perplexity"] == pytest.approx(math.exp(one["loss"]), rel=1e-6)
    assert one["bits_per_byte"] == pytest.approx(nll / math.log(2) / sum(len(d) for d in docs), rel=1e-5)
    # Short windows (some full, one partial) still score every next-token prediction once.
    short = perplexity(model, tok, docs, seq_len=5, eos_id=eos, device=dev, batch_size=2)
    assert short["tokens"] == len(stream) - 1 and short["loss"] > one["loss"] - 1e-6
    assert one["loss"] < 0.6 * math.log(tok.get_vocab_size())  # learned: well below uniform


def test_multiple_choice_prefers_the_learned_continuation(lm, tmp_path: Path) -> None:
    model, tok, _, meta = lm
    dev = select_device("fp32", measure_peak=False)
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [
        {"context": "the cat sat on the", "choices": ["park", "mat"], "answer": 1},
        {"context": "the dog ran in the", "choices": ["park", "mat ."], "answer": "park"},
        {"context": "the cat", "choices": [" sat on", " ran in the"], "answer": 0},
    ]) + "\n")
    items = read_choices(path)
    assert [i["answer"] for i in items] == [1, 0, 0]
    res = multiple_choice(model, tok, items, seq_len=32, device=dev, bos_id=meta["special_ids"][EOS])
    assert res["accuracy"] == 1.0 and res["accuracy_norm"] == 1.0
    assert res["chance"] == pytest.approx(0.5) and res["items"] == 3


def test_choice_scoring_follows_lm_eval_definitions(lm) -> None:
    # acc: highest summed log-likelihood; acc_norm: highest log-likelihood per *character* of
    # the choice (lm-eval's acc_norm). Per UTF-8 byte of " " + choice it would pick choice 0
    # here (-1.5/3 > -3/5); per character it picks choice 1 (-3/4 > -1.5/1).
    assert pick_choices([-1.5, -3.0], ["é", "abcd"]) == (0, 1)
    assert pick_choices([-9.0, -4.0, -4.5], ["x", "yy", "zzzzzzzzz"]) == (1, 2)
    _, tok, _, meta = lm
    eot = meta["special_ids"][EOS]

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    # a non-empty context gets no <|endoftext|> before it (lm-eval's _encode_pair) ...
    ctx, cont = encode_pair(tok, "the cat sat on the", " mat", eot)
    assert ctx == enc("the cat sat on the") and eot not in ctx
    assert ctx + cont == enc("the cat sat on the mat")
    # ... its trailing space moves to the continuation, and an empty context is <|endoftext|>
    assert encode_pair(tok, "the cat ", "sat", eot) == encode_pair(tok, "the cat", " sat", eot)
    assert encode_pair(tok, "", "the cat", eot) == ([eot], enc("the cat"))


def test_greedy_samples_continue_the_prompt(lm) -> None:
    model, tok, _, meta = lm
    dev = select_device("fp32", measure_peak=False)
    out = greedy_samples(model, tok, ["the cat sat"], 6, meta["special_ids"][EOS], dev)
    assert out[0]["prompt"] == "the cat sat" and out[0]["continuation"].startswith(" on the mat")
    # sampling: top-k 1 is the argmax at any temperature; a seed makes a hot sample repeatable
    top1 = greedy_samples(model, tok, ["the cat sat"], 6, meta["special_ids"][EOS], dev,
                          temperature=1.0, top_k=1)
    assert top1 == out
    hot = [greedy_samples(model, tok, ["the"] * 4, 8, None, dev, temperature=50.0, seed=s)
           for s in (0, 0, 1)]
    assert hot[0] == hot[1] and hot[0] != hot[2]  # near-uniform draws over the vocabulary


def test_bad_multiple_choice_files_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    cases = [
        ('{"context": "a", "choices": ["x", "y"]}', "missing field 'answer'"),
        ('{"context": "a", "choices": ["x", "y"], "answer": 2}', "choice index 0..1"),
        ('{"context": "a", "choices": ["x", "y"], "answer": "z"}', "not one of the choices"),
        ('{"context": "a", "choices": ["x"], "answer": 0}', "at least two"),
        ('{"context": "a", "choices": ["x", "y"], "answer": 0', "not valid JSON"),
    ]
    for line, message in cases:
        path.write_text('{"context": "ok", "choices": ["a", "b"], "answer": 0}\n' + line + "\n")
        with pytest.raises(ShoestringError, match=message) as e:
            read_choices(path)
        assert e.value.where == f"{path}:2"
    path.write_text("")
    with pytest.raises(ShoestringError, match="empty"):
        read_choices(path)


def test_cli_decoder_evals_on_a_decoder_run(lm, tmp_path: Path) -> None:
    from shoestring.rundir import RunDir

    model, _, tok_path, meta = lm
    run = tmp_path / "run"
    run.mkdir()
    RunDir(run).save_final(model, meta, tok_path)
    (tmp_path / "held.txt").write_text("the dog ran in the park . the cat sat on the mat .")
    (tmp_path / "mc.jsonl").write_text(json.dumps(
        {"context": "the cat sat on the", "choices": ["park", "mat"], "answer": 1}) + "\n")
    r = run_cli("eval", str(run), "--text", str(tmp_path / "held.txt"), "--choices",
                str(tmp_path / "mc.jsonl"), "--samples", "1", "--prompt", "the dog", "--precision", "fp32")
    assert r.returncode == 0, r.stderr
    assert "perplexity" in r.stdout and "multiple choice" in r.stdout and "sample" in r.stdout
    result = json.loads((run / "decoder_eval.json").read_text())
    assert result["multiple_choice"]["accuracy"] == 1.0
    assert result["perplexity"]["bits_per_byte"] > 0
    assert result["samples"][0]["continuation"].startswith(" ran in")
    assert result["samples_decoding"] == "greedy (--temperature 0)" and "greedy" in r.stdout
    r = run_cli("eval", str(run), "--text", str(tmp_path / "held.txt"), "--samples", "1",
                "--prompt", "the dog", "--precision", "fp32", "--temperature", "0.8",
                "--top-k", "5")
    assert r.returncode == 0, r.stderr
    result = json.loads((run / "decoder_eval.json").read_text())
    assert result["samples_decoding"] == "sampled (temperature 0.8, top-k 5, seed 0)"
    assert "sampled" in r.stdout
    r = run_cli("eval", str(run), "--glue", str(tmp_path))
    assert r.returncode == 2 and "needs an encoder" in r.stderr and "Traceback" not in r.stderr
