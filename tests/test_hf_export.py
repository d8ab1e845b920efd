"""Hugging Face export/import: transformers loads the export as ModernBERT with our logits.

Everything is local: tiny models with random weights, a tokenizer trained on a few hundred
builtin:pydocs documents, and `transformers` only on the checking side.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import run_cli
from shoestring.config import Config, ModelConfig
from shoestring.data.builtin import iter_pydocs
from shoestring.data.tokenizer import load_tokenizer, special_ids
from shoestring.prep.tokenizer_training import train_wordpiece
from shoestring.errors import ShoestringError
from shoestring.export import hf
from shoestring.model import build_model
from shoestring.model.detector import ReplacedTokenDetector, as_encoder
from shoestring.model.encoder import MaskedLM
from shoestring.export.hf import EXPORT_MARKER, export_encoder
from shoestring.export.hub import import_hf
from shoestring.rundir import RunDir, model_meta

transformers = pytest.importorskip("transformers")

CFG = ModelConfig(hidden_size=64, num_layers=3, num_heads=4, intermediate_size=96, rope_theta=5000.0)
SEQ_LEN = 64
TOL = 1e-4  # max abs logit difference allowed (fp32); measured: 0.0
TEXTS = [
    "Hello World! The QUICK brown fox.",
    "Café naïve ÉCOLE façade — résumé",
    "def f(x): return x**2  # squares, [1, 2, 3] -> {'a': 1}",
    "Unknown ✓ 😀 漢字 characters",
    "  tabs\tand\nnewlines  ",
    "",
]


def _tokenizer(path: Path, lowercase: bool = True) -> Path:
    docs = [doc.text for _, doc in zip(range(300), iter_pydocs())]
    train_wordpiece(docs, 1000, lowercase=lowercase).save(str(path))
    return path


def _run_dir(root: Path, tokenizer: Path, cfg: ModelConfig = CFG, seed: int = 0) -> Path:
    """A run dir with a randomly initialised model: what `train` leaves, without training."""
    tok = load_tokenizer(tokenizer)
    torch.manual_seed(seed)
    model = build_model(cfg, tok.get_vocab_size())
    if isinstance(model, ReplacedTokenDetector):  # a trained-looking delta (gdes adds it)
        with torch.no_grad():
            model.discriminator.tok_embeddings.weight.normal_(0, cfg.init_std)
    run = root / f"run-{cfg.objective}-{cfg.rtd_sharing}-{cfg.init_std}-{seed}"
    RunDir.create(run, overwrite=True)
    meta = model_meta(Config(model=cfg), tok.get_vocab_size(), SEQ_LEN, special_ids(tok))
    RunDir(run).save_final(model, meta, tokenizer)
    return run


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def exports(tokenizer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[float, tuple[Path, Path]]:
    """init_std → (run dir, its export); init_std=0.3 gives peaky attention, large logits."""
    root = tmp_path_factory.mktemp("hf")
    result = {}
    for std in (0.02, 0.3):
        run = _run_dir(root, tokenizer_file, CFG.model_copy(update={"init_std": std}))
        result[std] = (run, export_encoder(run, root / f"export-{std}"))
    return result


@pytest.fixture(params=[0.02, 0.3], ids=["std0.02", "std0.3"])
def exported(request, exports: dict[float, tuple[Path, Path]]) -> tuple[Path, Path]:
    """Each of the two exports in turn, for the checks of numbers."""
    return exports[request.param]


@pytest.fixture
def plain(exports: dict[float, tuple[Path, Path]]) -> tuple[Path, Path]:
    """One export, for the checks of files and refusals."""
    return exports[0.02]


def _load_hf(path: Path):
    model, info = transformers.AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True)
    return model.eval(), info


def test_transformers_logits_match_ours(exported: tuple[Path, Path]) -> None:
    run, out = exported
    ours, meta = RunDir(run).load_final()
    theirs, _ = _load_hf(out)
    assert type(theirs).__name__ == "ModernBertForMaskedLM"
    ids = torch.randint(0, meta["vocab_size"], (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(ids), theirs(input_ids=ids).logits
    assert a.shape == b.shape == (2, 48, meta["vocab_size"])
    assert a.abs().max() > 0.5  # not trivially close
    assert (a - b).abs().max().item() <= TOL


def test_padding_mask_matches_ours(exported: tuple[Path, Path]) -> None:
    """transformers' attention_mask and our key_mask both hide padded keys, nothing else."""
    run, out = exported
    ours, meta = RunDir(run).load_final()
    theirs, _ = _load_hf(out)
    ids = torch.randint(5, meta["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 25:] = False
    ids[1, 25:] = 0
    with torch.no_grad():
        a = ours.head(ours.encode(ids, mask))
        b = theirs(input_ids=ids, attention_mask=mask.long()).logits
    assert (a[mask] - b[mask]).abs().max().item() <= TOL


def _padded(vocab: int, seed: int, real: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 30 random ids, the second padded after ``real`` tokens, and their mask."""
    ids = torch.randint(5, vocab, (2, 30), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, real:] = False
    ids[1, real:] = 0
    return ids, mask


def _mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).float()
    return (hidden * m).sum(1) / m.sum(1)


def test_sequence_classifier_pools_the_mean_of_real_tokens(plain: tuple[Path, Path]) -> None:
    """AutoModelForSequenceClassification on the export pools the mean of our encoder's
    hidden states over the unpadded tokens (the export's ``classifier_pooling``), not [CLS]."""
    run, out = plain
    ours, meta = RunDir(run).load_final()
    torch.manual_seed(0)
    clf = transformers.AutoModelForSequenceClassification.from_pretrained(out, num_labels=3).eval()
    ids, mask = _padded(meta["vocab_size"], seed=2, real=18)
    with torch.no_grad():
        hidden = ours.encode(ids, mask)
        expected = clf.classifier(clf.head(_mean(hidden, mask)))
        cls = clf.classifier(clf.head(hidden[:, 0]))
        logits = clf(input_ids=ids, attention_mask=mask.long()).logits
    assert (logits - expected).abs().max().item() <= TOL
    assert (logits - cls).abs().max().item() > 100 * TOL  # [CLS] pooling would differ


@pytest.mark.parametrize("sharing", ["gdes", "plain"])
def test_an_rtd_run_exports_its_discriminator_as_a_plain_encoder(
        sharing: str, tokenizer_file: Path, tmp_path: Path) -> None:
    """model.objective=rtd: the export is the discriminator (its token table materialised
    under gdes), which AutoModel and AutoModelForSequenceClassification load with our hidden
    states and our mean-pooled classifier input, no weight missing or left over."""
    from shoestring.export.hub import export_run

    cfg = CFG.model_copy(update={"objective": "rtd", "rtd_sharing": sharing})
    run = _run_dir(tmp_path, tokenizer_file, cfg)
    out = export_run(run, tmp_path / "hf")
    ours, meta = as_encoder(*RunDir(run).load_final())
    assert json.loads((out / "config.json").read_text())["hidden_size"] == cfg.hidden_size
    base, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"], info
    torch.manual_seed(0)
    clf = transformers.AutoModelForSequenceClassification.from_pretrained(out, num_labels=2)
    _, info = _load_hf(out)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, mask = _padded(meta["vocab_size"], seed=3, real=20)
    with torch.no_grad():
        hidden = ours.encode(ids, mask)
        theirs = base.eval()(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        expected = clf.eval().classifier(clf.head(_mean(hidden, mask)))
        logits = clf(input_ids=ids, attention_mask=mask.long()).logits
    assert hidden.abs().max() > 0.5
    assert (hidden[mask] - theirs[mask]).abs().max().item() <= TOL
    assert (logits - expected).abs().max().item() <= TOL


def test_loading_reports_no_missing_or_unexpected_weights(plain: tuple[Path, Path]) -> None:
    _, out = plain
    theirs, info = _load_hf(out)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"] and not info["error_msgs"], info
    # The decoder is not stored but tied: it *is* the embedding matrix after loading.
    assert theirs.decoder.weight.data_ptr() == theirs.model.embeddings.tok_embeddings.weight.data_ptr()
    assert theirs.decoder.bias is None


def test_export_folder_contents(plain: tuple[Path, Path]) -> None:
    run, out = plain
    assert {p.name for p in out.iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", EXPORT_MARKER,
    }
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "modernbert" and cfg["architectures"] == ["ModernBertForMaskedLM"]
    assert cfg["layer_types"] == ["full_attention"] * 3
    assert cfg["rope_parameters"]["full_attention"]["rope_theta"] == 5000.0
    assert cfg["hidden_activation"] == "gelu" and cfg["decoder_bias"] is False
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no build leftovers
    loaded = transformers.AutoConfig.from_pretrained(out)
    assert loaded.max_position_embeddings >= SEQ_LEN


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_autotokenizer_ids_match_ours(lowercase: bool, tmp_path: Path) -> None:
    tokenizer = _tokenizer(tmp_path / "tokenizer.json", lowercase=lowercase)
    out = export_encoder(_run_dir(tmp_path, tokenizer), tmp_path / "export")
    ours = load_tokenizer(tokenizer)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.is_fast
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours.encode(text).ids, text
    assert 1 in theirs(TEXTS[3])["input_ids"]  # the unknown characters became [UNK]
    assert (theirs.pad_token_id, theirs.unk_token_id, theirs.cls_token_id, theirs.sep_token_id,
            theirs.mask_token_id) == (0, 1, 2, 3, 4)
    assert theirs.model_max_length == SEQ_LEN
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is lowercase


def test_round_trip_is_bit_identical(exported: tuple[Path, Path]) -> None:
    run, out = exported
    ours, meta = RunDir(run).load_final()
    back, back_meta = import_hf(out)
    assert back_meta == meta
    a, b = ours.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, meta["vocab_size"], (2, 48))
    with torch.no_grad():
        assert torch.equal(ours(ids), back(ids))


def test_import_reads_a_checkpoint_transformers_wrote(plain: tuple[Path, Path], tmp_path: Path) -> None:
    """save_pretrained's own output (its names, its tied-weight handling) imports exactly."""
    _, out = plain
    theirs, _ = _load_hf(out)
    theirs.save_pretrained(tmp_path / "resaved")
    back, _ = import_hf(tmp_path / "resaved")
    ids = torch.randint(0, theirs.config.vocab_size, (1, 32))
    with torch.no_grad():
        assert (back(ids) - theirs(input_ids=ids).logits).abs().max().item() <= TOL


def _edited(out: Path, tmp_path: Path, **changes: object) -> Path:
    """A copy of an export with config.json fields changed (None deletes a field)."""
    copy = tmp_path / "edited"
    shutil.copytree(out, copy)
    cfg = json.loads((copy / "config.json").read_text())
    for k, v in changes.items():
        cfg.pop(k) if v is None else cfg.__setitem__(k, v)
    (copy / "config.json").write_text(json.dumps(cfg))
    return copy


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"layer_types": ["full_attention", "sliding_attention", "sliding_attention"]}, "layer_types"),
        # no layer_types: ModernBertConfig's default makes every layer but each third sliding
        ({"layer_types": None, "global_attn_every_n_layers": None}, "global_attn_every_n_layers = 3"),
        ({"attention_bias": True}, "switches every bias together"),
        ({"mlp_bias": True}, "switches every bias together"),
        ({"decoder_bias": None}, "decoder_bias = true"),  # transformers' default is True
        ({"hidden_activation": "gelu_pytorch_tanh"}, 'hidden_activation = "gelu_pytorch_tanh"'),
        ({"tie_word_embeddings": False}, "tie_word_embeddings = false"),
        ({"mask_token_id": 7}, "mask_token_id = 7"),
        ({"rope_parameters": {"full_attention": {"rope_type": "linear", "rope_theta": 1.0, "factor": 2.0}}},
         "rope_type"),
        ({"model_type": "bert"}, 'model_type = "bert"'),
    ],
    ids=lambda x: next(iter(x)) if isinstance(x, dict) else None,
)
def test_import_refuses_what_it_cannot_represent(
    plain: tuple[Path, Path], tmp_path: Path, changes: dict, named: str
) -> None:
    _, out = plain
    with pytest.raises(ShoestringError, match="cannot import") as e:
        import_hf(_edited(out, tmp_path, **changes))
    assert named in str(e.value)


def test_import_refuses_transformers_default_config(tmp_path: Path) -> None:
    """A config as ModernBertConfig writes it by default (sliding layers, decoder bias)."""
    cfg = transformers.ModernBertConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=96, pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2,
        eos_token_id=3, decoder_bias=False,
    )
    cfg.save_pretrained(tmp_path)
    # transformers 5 writes the layers as layer_types; 4.x (the hf floor) as every-third
    written = json.loads((tmp_path / "config.json").read_text())
    named = "layer_types" if "layer_types" in written else "global_attn_every_n_layers = 3"
    with pytest.raises(ShoestringError, match=named) as e:
        import_hf(tmp_path)
    assert "sliding_attention" in str(e.value)


def test_import_refuses_an_untied_decoder_weight(plain: tuple[Path, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _, out = plain
    copy = _edited(out, tmp_path)
    state = load_file(str(copy / "model.safetensors"))
    state["decoder.weight"] = state["model.embeddings.tok_embeddings.weight"] + 1
    save_file(state, str(copy / "model.safetensors"))
    with pytest.raises(ShoestringError, match="decoder.weight"):
        import_hf(copy)


def test_export_refuses_an_option_without_a_modernbert_equivalent(
    plain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model option missing from the mapping table (as a new one would be) stops the export."""
    run, _ = plain
    monkeypatch.delitem(hf._EXPORT_OPTIONS, "rope_theta")
    with pytest.raises(ShoestringError, match="'rope_theta'.*no exact ModernBERT equivalent"):
        export_encoder(run, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_export_refuses_foreign_and_existing_folders(plain: tuple[Path, Path], tmp_path: Path) -> None:
    run, out = plain
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"model_type": "modernbert"}')
    with pytest.raises(ShoestringError, match="not a shoestring export"):
        export_encoder(run, foreign, overwrite=True)
    assert (foreign / "config.json").read_text() == '{"model_type": "modernbert"}'
    with pytest.raises(ShoestringError, match="--overwrite"):
        export_encoder(run, out)
    with pytest.raises(ShoestringError, match="final/ is missing"):
        export_encoder(tmp_path, tmp_path / "y")


def test_failed_export_keeps_the_previous_one(
    plain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, out = plain
    target = tmp_path / "export"
    shutil.copytree(out, target)
    before = (target / "model.safetensors").read_bytes()

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(hf, "save_safetensors", broken)
    with pytest.raises(OSError, match="disk full"):
        export_encoder(run, target, overwrite=True)
    assert (target / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


@pytest.mark.slow
def test_cli_export(plain: tuple[Path, Path], tmp_path: Path) -> None:
    run, _ = plain
    out = tmp_path / "hf"
    first = run_cli("export", str(run), "-o", str(out))
    assert first.returncode == 0, first.stderr
    assert "ModernBertForMaskedLM" in first.stdout and str(out) in first.stdout
    _, info = _load_hf(out)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    again = run_cli("export", str(run), "-o", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    assert run_cli("export", str(run), "-o", str(out), "--overwrite").returncode == 0

    not_run = run_cli("export", str(tmp_path), "-o", str(tmp_path / "other"))
    assert not_run.returncode == 2 and "final/ is missing" in not_run.stderr
    assert "Traceback" not in not_run.stderr
