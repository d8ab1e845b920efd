"""The from-scratch control: same code path, paired statistics, and a task where pretraining
must help (words the fine-tuning set never shows, whose class only pretraining can teach)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_config

from shoestring.config import DataConfig, ModelConfig
from shoestring.eval.control import compare_arms, seeds_for, seeds_needed
from shoestring.eval.finetune import initial_encoder
from shoestring.model.encoder import MaskedLM


def _arm(scores: list[float], split: str = "dev") -> list[dict]:
    return [{"seed": i, "splits": {split: {"score": s / 100}}} for i, s in enumerate(scores)]


def test_paired_comparison_matches_a_hand_computed_t_interval() -> None:
    # Differences 10, 7, 4: mean 7, sd 3; t(0.975, 2) = 4.3027 → half-width 4.3027·3/√3.
    cmp = compare_arms(_arm([80, 82, 84]), _arm([70, 75, 80]), "dev")
    half = 4.302653 * 3 / math.sqrt(3)
    assert cmp["difference_mean"] == pytest.approx(7.0)
    assert cmp["difference_std"] == pytest.approx(3.0)
    assert cmp["ci95"] == pytest.approx([7 - half, 7 + half], abs=1e-4)
    assert cmp["within_noise"] and "within noise" in cmp["verdict"]
    # 4 seeds: t(0.975, 3) = 3.182 → 3.182·3/2 = 4.77 < 7, the first count that resolves it.
    assert cmp["seeds_needed"] == 4 == seeds_needed(3.0, 7.0)
    clear = compare_arms(_arm([80, 81, 82]), _arm([70, 72, 71]), "dev")
    assert not clear["within_noise"] and clear["verdict"] == "pretraining helps"
    worse = compare_arms(_arm([60, 61, 62]), _arm([70, 72, 71]), "dev")
    assert worse["verdict"] == "pretraining hurts" and worse["ci95"][1] < 0
    same = compare_arms(_arm([74.8, 74.8, 74.8]), _arm([74.8, 74.8, 74.8]), "dev")
    assert same["within_noise"] and same["seeds_needed"] is None and "no difference" in same["verdict"]
    one = compare_arms(_arm([90]), _arm([50]), "dev")
    assert one["ci95"] is None and one["within_noise"] and "one seed" in one["verdict"]
    # Pairing is by seed, not by position.
    shuffled = list(reversed(_arm([70, 75, 80])))
    assert compare_arms(_arm([80, 82, 84]), shuffled, "dev")["difference_mean"] == pytest.approx(7.0)


def test_seed_rule_gives_small_dev_sets_more_seeds() -> None:
    assert seeds_for(408) == 5 and seeds_for(1999) == 5  # MRPC, just under the line
    assert seeds_for(2000) == 3 and seeds_for(9815) == 3  # MNLI-m


def test_control_differs_from_the_pretrained_arm_only_in_the_encoder_weights() -> None:
    torch.manual_seed(123)
    base = MaskedLM(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), 50)
    kept = initial_encoder(base, 3, from_scratch=False)
    head_pre = torch.nn.Linear(4, 4).weight.detach().clone()
    fresh = initial_encoder(base, 3, from_scratch=True)
    head_scr = torch.nn.Linear(4, 4).weight.detach().clone()
    again = initial_encoder(base, 3, from_scratch=True)
    other = initial_encoder(base, 4, from_scratch=True)
    names = list(base.state_dict())
    assert all(torch.equal(base.state_dict()[n], kept.state_dict()[n]) for n in names)
    weights = [n for n in names if n.endswith("weight") and "norm" not in n]
    assert all(not torch.equal(base.state_dict()[n], fresh.state_dict()[n]) for n in weights)
    assert all(torch.equal(fresh.state_dict()[n], again.state_dict()[n]) for n in names)
    assert any(not torch.equal(fresh.state_dict()[n], other.state_dict()[n]) for n in weights)
    assert torch.equal(head_pre, head_scr)  # the head after it is the same draw in both arms
    assert fresh is not base and kept is not base


ANIMALS = "cat dog horse cow sheep goat pig deer fox wolf".split()
VEHICLES = "car bus truck van train tram taxi bike cab jeep".split()
A_CTX = ["the {} ate grass in the field", "a {} slept near the barn", "the {} ran into the forest",
         "we fed the hungry {}", "the {} drank from the pond"]
V_CTX = ["the {} drove down the road", "a {} parked near the station", "the {} needed more fuel",
         "we repaired the broken {}", "the {} carried people to town"]


def _kind_rows(words: list[str]) -> str:
    return "\n".join(json.dumps({"text": tpl.format(w), "label": "animal" if w in ANIMALS else "vehicle"})
                     for w in words for tpl in ("i saw a {} today", "there is a {} over there",
                                                "look at that {}"))


@pytest.mark.slow
def test_pretraining_on_the_tasks_text_beats_scratch(tmp_path: Path) -> None:
    """Fine-tuning sees 5 animals and 5 vehicles; dev asks about the other 10. Only the
    pretraining text, where each word appears in its class's contexts, can tell them apart,
    so the pretrained arm must beat the scratch control clearly and the report must say so."""
    from shoestring.prep.prep import prep
    from shoestring.train.loop import train

    r = random.Random(0)
    docs = []
    for _ in range(600):
        sents = [r.choice(A_CTX).format(r.choice(ANIMALS)) if r.random() < 0.5
                 else r.choice(V_CTX).format(r.choice(VEHICLES)) for _ in range(6)]
        docs.append(json.dumps({"text": ". ".join(sents) + "."}))
    (tmp_path / "corpus.jsonl").write_text("\n".join(docs))
    prep([str(tmp_path / "corpus.jsonl")], tmp_path / "data", DataConfig(vocab_size=200, seq_len=32))
    # 200 steps at a high peak lr teach the classes as 800 at the default did, in a quarter of
    # the time (issue 62: at load 5-9 the 800 steps ran past the test's 600 s timeout). At
    # this size, pretrained vs scratch dev-accuracy medians: lr 7e-3 100 vs 45, 1e-2 90 vs 45;
    # the default 2e-3 needs the 800 steps (32 vs 45 after 200).
    train(tiny_config(steps=200, batch_size=32, lr=7e-3), tmp_path / "data", tmp_path / "run")
    (tmp_path / "train.jsonl").write_text(_kind_rows(ANIMALS[:5] + VEHICLES[:5]))
    (tmp_path / "dev.jsonl").write_text(_kind_rows(ANIMALS[5:] + VEHICLES[5:]))
    spec = f"name=kind,train={tmp_path}/train.jsonl,dev={tmp_path}/dev.jsonl,text=text,label=label"
    out = tmp_path / "out"
    # --set-like protocol overrides are not on the CLI: the fine-tuning needs a higher lr and
    # more epochs than GLUE-sane for 60 examples, so this goes through the library call.
    from shoestring.eval.downstream import evaluate_downstream
    from shoestring.eval.tasks import parse_task_arg

    res = evaluate_downstream(tmp_path / "run", custom=[parse_task_arg(spec)], out=out,
                              precision="fp32", overrides={"lr": 1e-3, "epochs": 20})
    task = res["tasks"]["kind"]
    assert [s["seed"] for s in task["seeds"]] == [0, 1, 2, 3, 4]  # auto: a 30-row dev set
    assert [s["seed"] for s in task["control"]["seeds"]] == [0, 1, 2, 3, 4]
    assert task["init"] == "pretrained" and task["control"]["init"] == "scratch"
    # Same code path: same steps and examples per seed in both arms.
    assert [s["steps"] for s in task["seeds"]] == [s["steps"] for s in task["control"]["seeds"]]
    cmp = task["comparison"]["dev"]
    assert cmp["verdict"] == "pretraining helps" and cmp["ci95"][0] > 0
    assert cmp["pretrained_median"] > cmp["scratch_median"] + 15
    md = (out / "results.md").read_text()
    assert "control: same architecture from scratch" in md and "pretraining helps" in md
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_seeds_and_control_flags_are_checked_up_front(tmp_path: Path) -> None:
    r = run_cli("eval", str(tmp_path), "--task", "x.yaml", "--seeds", "zero")
    assert r.returncode == 2 and "--seeds" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("cram", "-o", str(tmp_path / "c"), "--eval-task", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "task spec file not found" in r.stderr
    assert not (tmp_path / "c").exists()  # refused before any prep or training
    (tmp_path / "Foo").mkdir()
    r = run_cli("cram", "-o", str(tmp_path / "c"), "--eval-task", str(tmp_path / "Foo"))
    assert r.returncode == 2 and "not a GLUE task folder" in r.stderr
    # a folder that is not there: said so, under the flag given (was "--task: ... has no '='")
    r = run_cli("cram", "-o", str(tmp_path / "c"), "--eval-task", str(tmp_path / "glue/SST-2"))
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"--eval-task {tmp_path / 'glue/SST-2'}: no such task folder or task spec file" in text
    assert "has no '='" not in text and not (tmp_path / "c").exists()
    r = run_cli("cram", "-o", str(tmp_path / "c"), "--eval-task", "train=a.csv,oops")
    assert r.returncode == 2 and "--eval-task: task item 'oops' has no '='" in r.stderr
