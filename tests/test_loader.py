"""The training data loader: deterministic order, rank sharding, resumable cursor, prefetch,
and refusal of damaged shards."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from shoestring.data.datadir import DataDir
from shoestring.data.loader import BatchLoader, Cursor
from shoestring.data.shards import PackedSplit, token_dtype

from conftest import write_split
from shoestring.errors import ShoestringError

N, SEQ = 103, 8  # a prime number of rows: batches straddle epoch boundaries


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> PackedSplit:
    """Row i holds i (then i+1, ...), so a batch's first column names its rows."""
    root = tmp_path_factory.mktemp("loader")
    rows = np.arange(N)[:, None] + np.arange(SEQ)[None, :]
    info = write_split(root, "train", rows, token_dtype(1000), rows_per_shard=10)
    return PackedSplit(root, info, SEQ, token_dtype(1000).str, verify="sha256")


def _ids(batches: list[torch.Tensor]) -> list[list[int]]:
    return [b[:, 0].tolist() for b in batches]


def _take(loader: BatchLoader, steps: int) -> list[torch.Tensor]:
    with loader:
        return [next(loader) for _ in range(steps)]


def test_same_seed_same_batches_other_seed_other(split: PackedSplit) -> None:
    a = _ids(_take(BatchLoader(split, 8, seed=3), 30))
    b = _ids(_take(BatchLoader(split, 8, seed=3, prefetch=0), 30))
    c = _ids(_take(BatchLoader(split, 8, seed=4), 30))
    assert a == b and a != c


def test_each_epoch_is_a_permutation(split: PackedSplit) -> None:
    loader = BatchLoader(split, 1, seed=0)
    epoch0 = sum(_ids(_take(loader, N)), [])
    assert sorted(epoch0) == list(range(N))
    assert loader.cursor == Cursor(1, 0)
    loader2 = BatchLoader(split, N, seed=0, cursor=Cursor(1, 0))
    epoch1 = _ids(_take(loader2, 1))[0]
    assert sorted(epoch1) == list(range(N)) and epoch1 != epoch0


def test_batches_are_the_rows(split: PackedSplit) -> None:
    for batch in _take(BatchLoader(split, 5, seed=1), 3):
        assert batch.dtype == torch.int64 and batch.shape == (5, SEQ)
        np.testing.assert_array_equal(batch.numpy(), batch[:, :1].numpy() + np.arange(SEQ))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_union_of_ranks_is_the_single_process_batch(split: PackedSplit, world: int) -> None:
    steps, global_batch = 40, 12  # 40 × 12 = 480 rows: more than four epochs
    single = _ids(_take(BatchLoader(split, global_batch, seed=7), steps))
    per_rank = [
        _ids(_take(BatchLoader(split, global_batch, seed=7, rank=r, world=world), steps))
        for r in range(world)
    ]
    for step in range(steps):
        assert all(len(per_rank[r][step]) == global_batch // world for r in range(world))
        assert sum((per_rank[r][step] for r in range(world)), []) == single[step]


def test_global_batch_must_split_over_ranks(split: PackedSplit) -> None:
    with pytest.raises(ShoestringError, match="multiple of 4"):
        BatchLoader(split, 10, seed=0, world=4)
    with pytest.raises(ShoestringError, match="rank 2"):
        BatchLoader(split, 4, seed=0, rank=2, world=2)


def test_resume_from_a_saved_cursor(split: PackedSplit) -> None:
    reference = _ids(_take(BatchLoader(split, 9, seed=5), 50))
    loader = BatchLoader(split, 9, seed=5, prefetch=4)
    first = _ids([next(loader) for _ in range(23)])
    saved = loader.cursor.to_dict()  # what a checkpoint stores (prefetch ran further ahead)
    loader.close()
    assert saved == {"epoch": 23 * 9 // N, "offset": 23 * 9 % N}
    resumed = BatchLoader(split, 9, seed=5, cursor=Cursor.from_dict(saved))
    rest = _ids(_take(resumed, 27))
    assert first + rest == reference


def test_resume_on_every_rank(split: PackedSplit) -> None:
    single = _ids(_take(BatchLoader(split, 6, seed=2), 20))
    loaders = [BatchLoader(split, 6, seed=2, rank=r, world=3) for r in range(3)]
    for loader in loaders:
        _take(loader, 11)
    cursors = {tuple(loader.cursor.to_dict().items()) for loader in loaders}
    assert len(cursors) == 1  # every rank is at the same global position
    state = loaders[0].state_dict()
    resumed = [_take(BatchLoader(split, 6, seed=2, cursor=Cursor.from_dict(state), rank=r,
                                 world=3), 9) for r in range(3)]
    for step in range(9):
        assert sum((_ids(resumed[r])[step] for r in range(3)), []) == single[11 + step]


def test_bad_cursor_is_a_clear_error() -> None:
    with pytest.raises(ShoestringError, match="bad data cursor"):
        Cursor.from_dict({"epoch": 1})
    with pytest.raises(ShoestringError, match="negative"):
        Cursor.from_dict({"epoch": 0, "offset": -3})


def test_data_wait_is_measured(split: PackedSplit) -> None:
    loader = BatchLoader(split, 4, seed=0)
    _take(loader, 5)
    assert loader.batches == 5
    assert loader.last_wait >= 0.0 and loader.total_wait >= loader.last_wait


def test_a_failing_read_surfaces_in_the_consumer(split: PackedSplit) -> None:
    class Broken:
        ordered = False

        def __len__(self) -> int:
            return 10

        def take(self, indices: np.ndarray) -> np.ndarray:
            raise ShoestringError("disk on fire", where="shard 7")

    loader = BatchLoader(Broken(), 2, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ShoestringError, match="disk on fire"):
        next(loader)


def test_sorted_split_is_read_in_stored_order_first(split: PackedSplit) -> None:
    split.ordered = True
    try:
        first = sum(_ids(_take(BatchLoader(split, 10, seed=0), 10)), [])
        assert first == list(range(100))
        assert sum(_ids(_take(BatchLoader(split, 10, seed=0, shuffle=True), 10)), []) != first
    finally:
        split.ordered = False


# --- shard verification through the data dir -------------------------------------------


@pytest.fixture()
def data_copy(pydocs_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(pydocs_dir, copy)
    return copy


def test_corrupted_shard_is_refused_with_its_file_named(data_copy: Path) -> None:
    data = DataDir(data_copy)
    shard = data_copy / data.manifest["splits"]["train"]["shards"][0]["bin"]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x5A
    shard.write_bytes(bytes(raw))
    data.split("train", verify="size")  # same size: the fast check cannot tell
    with pytest.raises(ShoestringError, match="checksum") as info:
        data.split("train", verify="sha256")
    assert info.value.where == str(shard)


def test_truncated_shard_is_refused_by_the_fast_check(data_copy: Path) -> None:
    data = DataDir(data_copy)
    shard = data_copy / data.manifest["splits"]["train"]["shards"][0]["idx"]
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(ShoestringError, match="truncated") as info:
        data.split("train")
    assert info.value.where == str(shard)


def test_unknown_verify_mode(data_copy: Path) -> None:
    with pytest.raises(ShoestringError, match="sha256"):
        DataDir(data_copy).split("train", verify="md5")


def test_take_gathers_any_rows_across_shards_in_order(tmp_path: Path) -> None:
    """Rows in any order, repeated, from many shards (uint32 tokens), into a given buffer."""
    rows = np.arange(57)[:, None] * 100_000 + np.arange(SEQ)[None, :]  # ids above 2^16
    info = write_split(tmp_path, "train", rows, token_dtype(1 << 24), rows_per_shard=4)
    assert len(info["shards"]) == 15
    split = PackedSplit(tmp_path, info, SEQ, token_dtype(1 << 24).str)
    idx = np.array([56, 0, 13, 13, 4, 55, 29, 3, 0])
    out = np.full((len(idx), SEQ), -1, dtype=np.int64)
    assert split.take(idx, out=out) is out
    np.testing.assert_array_equal(out, rows[idx])
    np.testing.assert_array_equal(split.take(idx[::-1]), rows[idx[::-1]])
    assert split.take(np.zeros(0, dtype=np.int64)).shape == (0, SEQ)
    with pytest.raises(IndexError):
        split.take(np.array([57]))
    with pytest.raises(ValueError, match="int64"):
        split.take(idx, out=np.empty((len(idx), SEQ), dtype=np.int32))
