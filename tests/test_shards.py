from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shoestring.data.datadir import DataDir
from shoestring.prep.packing import StreamRows
from shoestring.prep.driver import is_validation
from shoestring.prep.stages import frame_rows
from shoestring.data.shards import PackedSplit, token_dtype

from conftest import write_split
from shoestring.errors import ShoestringError


def test_dtype_follows_vocab_size() -> None:
    assert token_dtype(30_000) == np.dtype("<u2")
    assert token_dtype(1 << 16) == np.dtype("<u2")
    assert token_dtype((1 << 16) + 1) == np.dtype("<u4")


@pytest.mark.parametrize("vocab", [5_000, 100_000])
def test_round_trip_across_shards(tmp_path: Path, vocab: int) -> None:
    rng = np.random.default_rng(0)
    rows = rng.integers(0, vocab, size=(1000, 32))
    info = write_split(tmp_path, "train", rows, token_dtype(vocab), rows_per_shard=128)
    assert info["sequences"] == 1000 and info["tokens"] == 32_000
    assert len(info["shards"]) == 8  # 128 sequences per shard, last one partial
    split = PackedSplit(tmp_path, info, 32, token_dtype(vocab).str, verify=True)
    assert len(split) == 1000
    idx = rng.permutation(1000)
    np.testing.assert_array_equal(split.take(idx), rows[idx])
    offsets = np.fromfile(tmp_path / info["shards"][0]["idx"], dtype="<u8")
    np.testing.assert_array_equal(offsets, np.arange(129) * 32)
    assert not list(tmp_path.rglob("*.tmp"))


def _small_split(tmp_path: Path) -> dict:
    return write_split(tmp_path, "val", np.arange(64).reshape(4, 16) % 100, token_dtype(100),
                       rows_per_shard=4)


def test_truncated_shard_is_named(tmp_path: Path) -> None:
    info = _small_split(tmp_path)
    path = tmp_path / info["shards"][0]["bin"]
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ShoestringError) as e:
        PackedSplit(tmp_path, info, 16, "<u2", verify=False)
    assert str(path) in str(e.value) and "truncated" in str(e.value)


def test_corrupted_shard_fails_checksum(tmp_path: Path) -> None:
    info = _small_split(tmp_path)
    path = tmp_path / info["shards"][0]["bin"]
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    PackedSplit(tmp_path, info, 16, "<u2", verify=False)  # same size: the fast check passes
    with pytest.raises(ShoestringError, match="checksum"):
        PackedSplit(tmp_path, info, 16, "<u2", verify=True)


def test_mlm_packing_keeps_every_token_in_order(tmp_path: Path) -> None:
    """Rows of the stream (`StreamRows`), framed [CLS] body [SEP] (`frame_rows`): every token
    but the final partial row's, in order."""
    for stream, n, rest in ((np.arange(100, 1100), 125, []), (np.arange(13), 1, range(8, 13))):
        path = tmp_path / "stream.bin"
        stream.astype("<u2").tofile(path)
        bodies = StreamRows(path, "<u2", 8)
        rows = frame_rows(bodies[0 : len(bodies)], 10, 2, 2, 3, np.dtype("<u2"))
        assert rows.shape == (n, 10)
        assert (rows[:, 0] == 2).all() and (rows[:, -1] == 3).all()
        np.testing.assert_array_equal(rows[:, 1:-1].ravel(), stream[: n * 8])
        assert list(stream[n * 8 :]) == list(rest)


def test_validation_split_is_deterministic_and_near_fraction() -> None:
    texts = [f"document number {i}" for i in range(20_000)]
    picks = [is_validation(t, 0.1) for t in texts]
    assert picks == [is_validation(t, 0.1) for t in texts]
    assert 0.09 < sum(picks) / len(picks) < 0.11


def test_prep_tokens_in_equal_tokens_out(pydocs_dir: Path) -> None:
    """Every training document's tokens appear in the shards, in order, joined by [SEP]."""
    from shoestring.data.builtin import iter_pydocs
    from shoestring.prep.clean import clean_text

    data = DataDir(pydocs_dir)
    m = data.manifest
    tok = data.tokenizer()
    cfg_min = m["config"]["min_chars"]
    frac = m["config"]["val_fraction"]
    texts = [t for t in (clean_text(d.text) for d in iter_pydocs()) if len(t) >= cfg_min]
    train_texts = [t for t in texts if not is_validation(t, frac)]
    assert len(train_texts) == m["documents"]["train"]
    sep = data.special_ids["[SEP]"]
    expected = np.concatenate(
        [np.array(e.ids + [sep]) for e in tok.encode_batch(train_texts, add_special_tokens=False)]
    )
    split = data.split("train", verify=True)
    bodies = split.take(np.arange(len(split)))[:, 1:-1].ravel()
    tail = m["splits"]["train"]["dropped_tail_tokens"]
    np.testing.assert_array_equal(bodies, expected[: len(expected) - tail])
    assert m["splits"]["train"]["document_tokens"] + len(train_texts) == len(expected)


def test_manifest_describes_the_files(pydocs_dir: Path) -> None:
    m = json.loads((pydocs_dir / "manifest.json").read_text())
    assert m["sources"] == ["builtin:pydocs"]
    assert m["documents"]["kept"] == m["documents"]["train"] + m["documents"]["val"]
    assert m["documents"]["val"] > 0
    for split in ("train", "val"):
        s = m["splits"][split]
        assert s["tokens"] == s["sequences"] * m["seq_len"]
        assert sum(sh["sequences"] for sh in s["shards"]) == s["sequences"]
        for sh in s["shards"]:
            assert (pydocs_dir / sh["bin"]).stat().st_size == sh["tokens"] * 2
    assert not list(pydocs_dir.glob("spool-*"))
