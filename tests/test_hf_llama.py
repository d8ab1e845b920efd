"""Decoder export/import: transformers loads the export as Llama with our logits and greedy
continuations; recipe options Llama cannot express refuse by name. Also the ModernBERT export
of the encoder's optional recipe (biases, SwiGLU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from shoestring.config import Config, ModelConfig
from shoestring.data.builtin import iter_pydocs
from shoestring.errors import ShoestringError
from shoestring.model import build_model
from shoestring.export.hub import export_run, import_hf
from shoestring.rundir import RunDir, model_meta

transformers = pytest.importorskip("transformers")

TOL = 1e-4
DEC = ModelConfig(objective="clm", hidden_size=64, num_layers=2, num_heads=4,
                  intermediate_size=96, init_std=0.1)
SPECIALS = {"<|endoftext|>": 0, "<|pad|>": 1}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((d.text for _, d in zip(range(200), iter_pydocs())), trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return path


def _run(root: Path, tokenizer: Path, cfg: ModelConfig, name: str) -> Path:
    vocab = Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    torch.manual_seed(0)
    model = build_model(cfg, vocab)
    run = root / name
    RunDir.create(run, overwrite=True)
    ids = SPECIALS if cfg.objective == "clm" else {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    RunDir(run).save_final(model, model_meta(Config(model=cfg), vocab, 64, ids), tokenizer)
    return run


@pytest.mark.parametrize("change", [{}, {"tie_embeddings": False, "num_kv_heads": 2},
                                    {"bias": True}], ids=["tied", "untied-gqa", "bias"])
def test_llama_export_matches_logits_and_generation(bpe: Path, tmp_path: Path, change: dict) -> None:
    run = _run(tmp_path, bpe, DEC.model_copy(update=change), "run")
    out = export_run(run, tmp_path / "hf")
    ours, meta = RunDir(run).load_final()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    ids = torch.randint(0, meta["vocab_size"], (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(ids), theirs(input_ids=ids).logits
    assert a.abs().max() > 0.5
    assert (a - b).abs().max().item() <= TOL
    prompt = ids[:, :6]
    hf_greedy = theirs.generate(prompt, max_new_tokens=10, do_sample=False, min_new_tokens=10,
                                pad_token_id=1)
    assert torch.equal(ours.generate(prompt, 10, temperature=0), hf_greedy)
    # import back: the same model
    back, back_meta = import_hf(out)
    assert back_meta["special_ids"] == SPECIALS
    # the trained context, not 2048: clients size their windows by it (issue 37)
    assert theirs.config.max_position_embeddings == 64 == back_meta["seq_len"]
    for (n1, p1), (n2, p2) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "def generate(self): return 'hello'"
    assert tok(text)["input_ids"] == Tokenizer.from_file(str(bpe)).encode(text).ids


@pytest.mark.parametrize(("change", "named"), [
    ({"norm": "layernorm"}, "'norm' = 'layernorm'"),
    ({"ffn": "geglu"}, "'ffn' = 'geglu'"),
    ({"positions": "learned"}, "'positions' = 'learned'"),
    ({"embedding_norm": True}, "'embedding_norm' = True"),
])
def test_llama_export_refuses_what_llama_cannot_compute(bpe: Path, tmp_path: Path, change: dict,
                                                        named: str) -> None:
    run = _run(tmp_path, bpe, DEC.model_copy(update=change), "run")
    with pytest.raises(ShoestringError, match="no exact Llama equivalent") as e:
        export_run(run, tmp_path / "hf")
    assert named in str(e.value)
    assert not (tmp_path / "hf").exists()


ENC = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96, init_std=0.1)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shoestring.prep.tokenizer_training import train_wordpiece

    path = tmp_path_factory.mktemp("wp") / "tokenizer.json"
    train_wordpiece([d.text for _, d in zip(range(200), iter_pydocs())], 500, lowercase=True).save(str(path))
    return path


@pytest.mark.parametrize("change", [{"ffn": "swiglu"}, {"bias": True}], ids=["swiglu", "bias"])
def test_modernbert_export_of_optional_recipe_matches(wordpiece: Path, tmp_path: Path, change: dict) -> None:
    cfg = ENC.model_copy(update=change)
    run = _run(tmp_path, wordpiece, cfg, "enc")
    ours, meta = RunDir(run).load_final()
    with torch.no_grad():  # biases start at zero; make them matter
        for name, p in ours.named_parameters():
            if name.endswith("bias") or name == "decoder_bias":
                p.normal_(0, 0.1)
    RunDir(run).save_final(ours, meta, wordpiece)
    out = export_run(run, tmp_path / "hf", overwrite=False)
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    ids = torch.randint(5, meta["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids) - theirs(input_ids=ids).logits).abs().max().item() <= TOL
    back, _ = import_hf(out)
    assert back.cfg.bias == cfg.bias and back.cfg.ffn == cfg.ffn


@pytest.mark.parametrize(("change", "named"), [
    ({"norm": "rmsnorm"}, "'norm' = 'rmsnorm'"),
    ({"norm_position": "post"}, "'norm_position' = 'post'"),
    ({"ffn": "gelu"}, "'ffn' = 'gelu'"),
    ({"positions": "sinusoidal"}, "'positions' = 'sinusoidal'"),
    ({"tie_embeddings": False}, "'tie_embeddings' = False"),
    ({"embedding_norm": False}, "'embedding_norm' = False"),
])
def test_modernbert_export_refuses_by_option(wordpiece: Path, tmp_path: Path, change: dict,
                                              named: str) -> None:
    run = _run(tmp_path, wordpiece, ENC.model_copy(update=change), "enc")
    with pytest.raises(ShoestringError, match="no exact ModernBERT equivalent") as e:
        export_run(run, tmp_path / "hf")
    assert named in str(e.value)


def test_a_llama_export_is_served_as_a_decoder(bpe: Path, tmp_path: Path) -> None:
    """`serve` picks the engine by family for exports as for run dirs."""
    from shoestring.inference.engine import load_engine

    out = export_run(_run(tmp_path, bpe, DEC, "run"), tmp_path / "hf")
    engine = load_engine(out)
    assert engine.kind == "decoder" and "generate" in engine.tasks
