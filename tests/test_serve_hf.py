"""`shoestring serve` on another project's transformers folders (inference/hf_folder.py): tiny
random BERTs saved by transformers' own ``save_pretrained`` (a sentence-transformers layout, a
masked LM, a cross-encoder), served by a real server on a loopback port, each answer checked
against transformers' own forward; and the folders serve must refuse, through the real CLI."""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import fails_cleanly, run_cli

from shoestring.artifacts import Kind, identify
from shoestring.errors import ShoestringError
from shoestring.inference.engine import load_engine
from shoestring.serve.server import ServerThread, load_router
from shoestring.serve.settings import make_settings

transformers = pytest.importorskip("transformers")

# Special tokens named otherwise than BERT's, and not at ids 0-4: the engine must take them
# from the tokenizer's config, not assume [PAD]=0, [MASK]=4.
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<mask>"]
WORDS = ["the", "man", "is", "playing", "a", "guitar", "dog", "cat", "quick", "brown", "fox",
         "query", "document", "about", "music", "runs"]
TEXTS = ["the man is playing a guitar.", "a quick brown fox!", "the dog runs",
         "query about music, playing the guitar and more music", "cat"]


def _tokenizer(folder: Path, model_max_length: int = 64) -> None:
    """A real WordPiece tokenizer (the `tokenizers` library) saved by transformers."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces = [*string.ascii_lowercase, *("##" + c for c in string.ascii_lowercase), *".,!?"]
    vocab = {t: i for i, t in enumerate(["x0", "x1", "x2", *SPECIALS, *WORDS, *pieces])}
    tk = Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    tk.decoder = decoders.WordPiece()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>", cls_token="<s>",
        sep_token="</s>", mask_token="<mask>", model_max_length=model_max_length,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    ).save_pretrained(str(folder))


def _config(**kw: object) -> object:
    return transformers.BertConfig(vocab_size=90, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64,
                                   max_position_embeddings=128, pad_token_id=3, **kw)


def _write_st_layout(folder: Path, pooling: str = "cls", max_seq_length: int = 48) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": pooling == "cls",
         "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
         "pooling_mode_mean_sqrt_len_tokens": False}))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    out = {"st": root / "st", "mlm": root / "mlm", "ce": root / "ce", "root": root}
    transformers.BertModel(_config()).save_pretrained(str(out["st"]))
    transformers.BertForMaskedLM(_config()).save_pretrained(str(out["mlm"]))
    transformers.BertForSequenceClassification(
        _config(num_labels=2, id2label={0: "irrelevant", 1: "relevant"},
                label2id={"irrelevant": 0, "relevant": 1})).save_pretrained(str(out["ce"]))
    for name in ("st", "mlm", "ce"):
        _tokenizer(out[name])
    _write_st_layout(out["st"])
    return out


def _ref(folder: Path, auto: str, *texts: list[str]) -> tuple[object, dict]:
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = getattr(transformers, auto).from_pretrained(str(folder)).eval()
    enc = tok(*texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        return model(**enc), enc


@pytest.fixture(scope="module")
def client(folders: dict[str, Path]):
    """A client of one real server of the three folders (requests pick one by "model")."""
    settings = make_settings(port=0, max_wait_ms=20, backend="torch")  # exact comparisons
    srv = ServerThread(load_router([str(folders[n]) for n in ("st", "mlm", "ce")], settings),
                       settings).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            yield c
    finally:
        srv.stop()


def test_identify_names_transformers_folders(folders: dict[str, Path]) -> None:
    for name in ("st", "mlm", "ce"):
        assert identify(folders[name]).kind is Kind.HF_ENCODER
    with pytest.raises(ShoestringError, match="transformers encoder folder"):
        identify(folders["st"], want=(Kind.RUN,), command="shoestring eval")


def test_sentence_transformers_embeddings_match_transformers(folders: dict[str, Path],
                                                             client: httpx.Client) -> None:
    """Defaults are the folder's own ([CLS], normalized, its max_seq_length); explicit values
    still apply; one request of many texts = the texts one by one."""
    out, enc = _ref(folders["st"], "AutoModel", TEXTS)
    hidden = out.last_hidden_state
    cls = torch.nn.functional.normalize(hidden[:, 0], dim=-1).numpy()
    m = enc["attention_mask"].unsqueeze(-1).float()
    mean = ((hidden * m).sum(1) / m.sum(1)).numpy()
    r = client.post("/v1/embed", json={"inputs": TEXTS, "model": "st"})
    assert r.status_code == 200, r.text
    got = np.array(r.json()["embeddings"])
    np.testing.assert_allclose(got, cls, atol=1e-5)
    r = client.post("/v1/embed", json={"inputs": TEXTS, "model": "st", "pooling": "mean",
                                       "normalize": False})
    np.testing.assert_allclose(np.array(r.json()["embeddings"]), mean,
                               atol=1e-5)
    for i, text in enumerate(TEXTS):
        one = client.post("/v1/embed", json={"inputs": text, "model": "st"}).json()
        np.testing.assert_allclose(one["embeddings"][0], got[i], atol=1e-5)
    info = client.get("/v1/model").json()  # the first model named: st
    assert info["embedding"] == {"pooling": "cls", "normalize": True}
    assert info["max_length"] == 48  # sentence_bert_config's max_seq_length, under 64 and 128
    assert info["tasks"] == ["embed"]  # a BertModel has no masked-LM head


def test_fill_mask_matches_the_masked_lm(folders: dict[str, Path], client: httpx.Client) -> None:
    texts = ["the man <mask> playing a guitar.", "a <mask> brown <mask>!"]
    out, enc = _ref(folders["mlm"], "AutoModelForMaskedLM", texts)
    probs = out.logits.softmax(-1)
    r = client.post("/v1/fill-mask", json={"inputs": texts, "model": "mlm", "top_k": 5})
    assert r.status_code == 200, r.text
    mask_id = 7  # <mask>: after x0-x2, <pad>, <unk>, <s>, </s>
    for row, result in enumerate(r.json()["results"]):
        positions = (enc["input_ids"][row] == mask_id).nonzero()[:, 0].tolist()
        assert [m["position"] for m in result] == positions
        for m in result:
            top = probs[row, m["position"]].topk(5)
            assert [c["id"] for c in m["candidates"]] == top.indices.tolist()
            np.testing.assert_allclose([c["score"] for c in m["candidates"]],
                                       top.values.numpy(), atol=1e-5)
    r = client.post("/v1/fill-mask", json={"inputs": "no mask here", "model": "mlm"})
    assert r.status_code == 422 and "<mask>" in r.text


def test_cross_encoder_scores_match_sequence_classification(folders: dict[str, Path],
                                                            client: httpx.Client) -> None:
    """Pairs get BERT's segment ids (1 after the first separator), as the tokenizer writes."""
    queries = ["query about music", "the dog", "cat"]
    docs = ["a man is playing a guitar.", "a quick brown fox runs", "the cat"]
    out, _ = _ref(folders["ce"], "AutoModelForSequenceClassification", queries, docs)
    want = out.logits.softmax(-1).numpy()
    r = client.post("/v1/classify", json={"inputs": queries, "pairs": docs, "model": "ce"})
    assert r.status_code == 200, r.text
    got = np.array([[x["scores"]["irrelevant"], x["scores"]["relevant"]]
                    for x in r.json()["results"]])
    np.testing.assert_allclose(got, want, atol=1e-5)
    one = client.post("/v1/classify", json={"inputs": queries[1], "pairs": [docs[1]],
                                            "model": "ce"}).json()["results"][0]
    assert one["scores"]["relevant"] == pytest.approx(got[1, 1], abs=1e-5)
    single, _ = _ref(folders["ce"], "AutoModelForSequenceClassification", ["the dog runs"])
    r = client.post("/v1/classify", json={"inputs": "the dog runs", "model": "ce"})
    assert r.json()["results"][0]["scores"]["relevant"] == pytest.approx(
        float(single.logits.softmax(-1)[0, 1]), abs=1e-5)


def test_a_transformers_cross_encoder_reranks(client: httpx.Client) -> None:
    """A cross-encoder folder takes single texts and pairs alike (its ``pair`` is None): it
    still reranks, by the positive label's probability of each (query, document) pair, best
    first, as /v1/classify scores the same pairs."""
    docs = ["a man is playing a guitar.", "a quick brown fox runs", "the cat"]
    r = client.post("/v1/rerank", json={"query": "the dog", "documents": docs, "model": "ce"})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    scores = client.post("/v1/classify", json={"inputs": ["the dog"] * 3, "pairs": docs,
                                               "model": "ce"}).json()["results"]
    want = sorted(((x["scores"]["relevant"], i) for i, x in enumerate(scores)), reverse=True)
    assert [x["index"] for x in results] == [i for _, i in want]
    assert [x["relevance_score"] for x in results] == pytest.approx([s for s, _ in want],
                                                                    abs=1e-6)


def test_a_modernbert_our_importer_refuses_is_served_by_transformers(
        folders: dict[str, Path]) -> None:
    """A ModernBERT with sliding-window layers (as the hub's are) is not one `shoestring
    export` wrote: identify still calls it an export, the importer refuses it, and the engine
    serves it through transformers instead, fill-mask included."""
    folder = folders["root"] / "modernbert"
    torch.manual_seed(1)
    transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        vocab_size=90, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=64, pad_token_id=3, cls_token_id=5, sep_token_id=6, bos_token_id=5,
        eos_token_id=6, local_attention=4)).save_pretrained(str(folder))
    _tokenizer(folder)
    assert identify(folder).kind is Kind.EXPORT
    engine = load_engine(folder)
    assert engine.tasks == {"embed", "fill-mask"}
    out, enc = _ref(folder, "AutoModelForMaskedLM", TEXTS)
    base = transformers.AutoModel.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        hidden = base(**{k: v for k, v in enc.items() if k != "token_type_ids"}).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    want = torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1).numpy()
    got = np.stack(engine.run(("embed",), engine.prepare_embed(TEXTS, None, None, many=True)))
    np.testing.assert_allclose(got, want, atol=1e-5)
    masked = engine.prepare_fill_mask(["the man <mask> playing"], 3, many=False)
    top = engine.run(("fill-mask",), masked)[0][0]
    probe, penc = _ref(folder, "AutoModelForMaskedLM", ["the man <mask> playing"])
    position = int((penc["input_ids"][0] == 7).nonzero()[0, 0])
    assert [c["id"] for c in top["candidates"]] == \
        probe.logits[0, position].topk(3).indices.tolist()


def test_dense_retrieval_embeds_with_the_models_pooling(folders: dict[str, Path]) -> None:
    """`shoestring index --encoder` takes a transformers folder: its pooling, normalized."""
    from shoestring.retrieval.dense import Embedder

    out, _ = _ref(folders["st"], "AutoModel", TEXTS)
    want = torch.nn.functional.normalize(out.last_hidden_state[:, 0], dim=-1).numpy()
    embedder = Embedder(folders["st"])
    np.testing.assert_allclose(embedder.embed(TEXTS, batch=2), want, atol=1e-5)
    assert embedder.dim == 32 and embedder.pooling == "cls, L2-normalized"


@pytest.mark.slow  # two CLI runs (~10 s each on a shared machine)
def test_folders_that_cannot_be_served_are_refused_by_name(folders: dict[str, Path]) -> None:
    root = folders["root"]
    gpt = root / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=90)).save_pretrained(str(gpt))
    r = run_cli("serve", str(gpt), "--port", "0")
    fails_cleanly(r, str(gpt), "transformers decoder folder", "own runs and exports")
    no_tok = root / "no-tokenizer"
    transformers.BertModel(_config()).save_pretrained(str(no_tok))
    r = run_cli("serve", str(no_tok), "--port", "0")
    fails_cleanly(r, str(no_tok), "no tokenizer here")
    # The same refusals in-process (the CLI prints these messages, exit 2).
    gpt_body = root / "gpt2-body"
    transformers.GPT2Model(transformers.GPT2Config(
        n_embd=32, n_layer=1, n_head=2, vocab_size=90)).save_pretrained(str(gpt_body))
    with pytest.raises(ShoestringError, match="'gpt2' is not an encoder"):
        load_engine(gpt_body)
    no_weights = root / "no-weights"
    _config().save_pretrained(str(no_weights))
    with pytest.raises(ShoestringError, match="no weights in this folder"):
        load_engine(no_weights)
    max_pooled = root / "max-pooled"
    transformers.BertModel(_config()).save_pretrained(str(max_pooled))
    _tokenizer(max_pooled)
    _write_st_layout(max_pooled, pooling="max")
    with pytest.raises(ShoestringError, match="pooling_mode_max_tokens"):
        load_engine(max_pooled)
    (max_pooled / "modules.json").write_text(json.dumps(
        [{"path": "", "type": "sentence_transformers.models.Transformer"},
         {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ShoestringError, match="Dense"):
        load_engine(max_pooled)


def test_without_transformers_the_install_command_is_named(folders: dict[str, Path]) -> None:
    """transformers is an extra: the real CLI, with it hidden, says how to install it."""
    code = ("import sys; sys.modules['transformers'] = None; "
            "from shoestring.cli import main; sys.argv = ['shoestring'] + sys.argv[1:]; main()")
    r = subprocess.run([sys.executable, "-c", code, "serve", str(folders["st"]), "--port", "0"],
                       capture_output=True, text=True, timeout=300)
    fails_cleanly(r, "transformers", "pip install 'shoestring[hf]'")
