"""The data dir that `prep` writes and `train`/`eval` read (see docs/artifacts.md), and its
fingerprint (`data_fingerprint`: what it was built from), which prep, `cram` and the
retrieval index compare."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from shoestring.config import CurateConfig, DataConfig
from shoestring.data.shards import PackedSplit
from shoestring.data.sources import resolve_sources
from shoestring.data.tokenizer import load_tokenizer
from shoestring.errors import ShoestringError
from shoestring.fsutil import file_sha256, json_object_or_none

FORMAT = "shoestring-data/1"


class DataDir:
    """A prepared data dir: manifest, tokenizer and packed splits, checked on open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        manifest = self.path / "manifest.json"
        if not self.path.is_dir():
            raise ShoestringError(
                "data dir not found", where=str(self.path), fix="run shoestring prep first"
            )
        if not manifest.is_file():
            raise ShoestringError(
                "not a shoestring data dir (no manifest.json)",
                where=str(self.path),
                fix="point --data at a folder written by shoestring prep",
            )
        try:
            self.manifest = json.loads(manifest.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ShoestringError(f"manifest is not valid JSON ({e})", where=str(manifest)) from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            found = self.manifest.get("format") if isinstance(self.manifest, dict) else None
            raise ShoestringError(
                f"unknown data format {found!r} (expected {FORMAT})",
                where=str(manifest),
                fix="re-run shoestring prep with this version",
            )
        missing = [k for k in ("tokenizer", "seq_len", "dtype", "splits") if k not in self.manifest]
        if missing:
            raise ShoestringError(
                f"manifest lacks {', '.join(missing)}: it is damaged",
                where=str(manifest),
                fix="re-run shoestring prep",
            )
        tok_info = self.manifest["tokenizer"]
        tok_path = self.path / tok_info["file"]
        if not tok_path.is_file() or file_sha256(tok_path) != tok_info["sha256"]:
            raise ShoestringError(
                "tokenizer.json is missing or does not match the manifest's hash",
                where=str(tok_path),
                fix="re-run shoestring prep",
            )

    @property
    def objective(self) -> str:
        """``mlm`` or ``clm`` (data dirs from before CLM support are MLM)."""
        return str(self.manifest.get("objective", "mlm"))

    @property
    def seq_len(self) -> int:
        return int(self.manifest["seq_len"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self.manifest["tokenizer"]["special_ids"])

    @property
    def tokenizer_path(self) -> Path:
        return self.path / self.manifest["tokenizer"]["file"]

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer_path)

    def split(self, name: str, verify: bool | str = "size") -> PackedSplit:
        """The packed sequences of ``name``; ``verify``: ``"size"`` (or False) checks every
        shard's size against the manifest, ``"sha256"`` (or True) its checksum too."""
        info = self.manifest["splits"].get(name)
        if not info or info["sequences"] == 0:
            raise ShoestringError(
                f"the data dir has no '{name}' sequences", where=str(self.path),
                fix="prep a larger corpus (or raise data.val_fraction for the val split)",
            )
        return PackedSplit(self.path, info, self.seq_len, self.manifest["dtype"], verify)

    def unigram_logprobs(self) -> np.ndarray:
        """log p(token) from training-token frequencies (add-one smoothed, specials excluded)."""
        counts = self.split("train").token_counts(self.vocab_size).astype(np.float64)
        n_special = len(self.special_ids)
        counts[:n_special] = 0.0
        counts[n_special:] += 1.0
        with np.errstate(divide="ignore"):
            return np.log(counts / counts.sum())


def check_data_settings(cfg: Any, data_dir: str | Path, keys: set[str]) -> None:
    """Refuse the ``data.*`` settings ``keys`` (those the user set in ``cfg``, a `Config`) that
    disagree with what the data dir was prepared with: training reads the data as it is, so such a
    setting would be silently ignored (and wrongly recorded in the run's config.yaml)."""
    from pydantic import ValidationError

    data = DataDir(data_dir)
    recorded = data.manifest.get("config") or {}
    try:  # normalized (older names of values), when the manifest's settings still validate
        recorded = DataConfig.model_validate(recorded).model_dump(mode="json")
    except ValidationError:
        pass
    recorded = {**recorded, "seq_len": data.seq_len, "objective": data.objective}
    given = cfg.data.model_dump(mode="json")
    for key in sorted(keys - {"workers"}):
        if key in recorded and given[key] != recorded[key]:
            raise ShoestringError(
                f"data.{key}={given[key]!r} disagrees with the data dir, prepared with "
                f"{key}={recorded[key]!r} (manifest.json); training reads the data as prepared",
                where=str(data.path),
                fix=f"drop data.{key} from --set/--config, or re-run shoestring prep with it",
            )


def _fingerprint(specs: list[str], files: list[str], cfg: DataConfig) -> str:
    """What the output depends on: specs, files (size, mtime), settings (not ``workers``)."""
    h = hashlib.sha256()
    settings = cfg.model_dump(mode="json", exclude={"workers"})
    h.update(json.dumps({"specs": specs, "cfg": settings}, sort_keys=True).encode())
    paths = list(files)
    if cfg.tokenizer_file:
        paths.append(cfg.tokenizer_file)
    for f in paths:
        p = Path(f)
        if p.is_file():
            st = p.stat()
            h.update(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
        else:
            h.update(f.encode())
    return h.hexdigest()


def data_fingerprint(specs: list[str], cfg: DataConfig, curate: CurateConfig | None = None,
                     files: list[str] | None = None) -> str:
    """What a data dir was built from (sources, data settings, curation); `cram` reuses a
    data dir whose fingerprint matches, and an interrupted prep resumes only on a match."""
    fingerprint = _fingerprint(specs, resolve_sources(specs) if files is None else files, cfg)
    if curate is not None:  # curation changes the output (and so do the dedup-against dirs)
        settings = json.dumps(curate.model_dump(mode="json", exclude={"explain"}), sort_keys=True)
        if curate.dedup_against:
            settings += json.dumps(_manifest_fingerprints(curate.dedup_against))
        fingerprint = hashlib.sha256(f"{fingerprint}:{settings}".encode()).hexdigest()
    return fingerprint


def _manifest_fingerprints(dirs: list[str]) -> list[str | None]:
    """The fingerprints of data dirs (None where there is no readable manifest)."""
    return [(json_object_or_none(Path(d) / "manifest.json") or {}).get("fingerprint")
            for d in dirs]
