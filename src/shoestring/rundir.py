"""The run dir: what `train` writes and `eval`/`export`/`serve`/`report` read (docs/artifacts.md).

``RunDir`` is the one reader and writer of its layout::

    .shoestring-run                 marker: shoestring made this folder (overwrite may delete it)
    config.yaml                     the fully resolved Config
    metrics.jsonl                   one JSON record per log step / validation
    tb/                             TensorBoard events
    checkpoints/step_NNNNNNNN/      DCP shards + state.json (written last: complete when present)
    final/                          model.safetensors, config.json (meta), tokenizer.json
    summary.json                    tokens, FLOPs, MFU, wall time, losses, versions
    eval.json, decoder_eval.json, downstream/   written by `eval`

Whole files are written to a temporary name and renamed; ``final/`` is built as a temporary
folder and renamed, so it is complete or absent (shoestring.fsutil).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoestring import families
from shoestring.errors import ShoestringError
from shoestring.fsutil import (
    WRITER_LOCK,
    building_dir,
    check_output_dir,
    json_object_or_none,
    read_yaml,
    write_json_atomic,
    write_text_atomic,
    writer_lock,
)

if TYPE_CHECKING:
    import torch

    from shoestring.config import Config

MARKER = ".shoestring-run"
CHECKPOINT_PREFIX = "step_"

__all__ = ["CHECKPOINT_PREFIX", "MARKER", "RunDir", "model_meta", "parse_metrics"]


class RunDir:
    """One run dir on disk. Constructing it touches nothing; ``create`` makes a new one."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @classmethod
    def create(cls, path: str | Path, overwrite: bool) -> RunDir:
        """Create the run dir; refuse to mix a new run into an old one unless asked to.

        ``overwrite`` only ever deletes a folder that carries the marker file shoestring
        writes into every run dir, so a user's own folder is never removed by mistake.
        """
        run = cls(path)
        check_output_dir(run.path, "run dir", owned=run.is_run, overwrite=overwrite)
        if run.path.is_dir():  # emptied, not removed: its writer lock (`writing`) must stay
            for child in run.path.iterdir():
                if child.name == WRITER_LOCK:
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        run.path.mkdir(parents=True, exist_ok=True)
        (run.path / MARKER).write_text("shoestring run dir\n", encoding="utf-8")
        return run

    def writing(self, enabled: bool = True) -> contextlib.AbstractContextManager[None]:
        """``with run.writing():`` — this process is the run dir's one writer (train and
        resume hold it; a second gets a clear error). ``enabled``: False on the ranks of a
        job other than rank 0."""
        return writer_lock(self.path, "run dir", enabled)

    # --- layout ----------------------------------------------------------------------
    @property
    def is_run(self) -> bool:
        """True when the folder carries shoestring's run marker."""
        return (self.path / MARKER).is_file()

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def final_dir(self) -> Path:
        return self.path / "final"

    @property
    def tokenizer_path(self) -> Path:
        """The tokenizer saved with the final model."""
        return self.final_dir / "tokenizer.json"

    @property
    def tb_dir(self) -> Path:
        return self.path / "tb"

    @property
    def eval_path(self) -> Path:
        """The held-out masked-LM evaluation (``eval``)."""
        return self.path / "eval.json"

    @property
    def decoder_eval_path(self) -> Path:
        """The decoder evaluation (``eval`` of a causal LM)."""
        return self.path / "decoder_eval.json"

    @property
    def downstream_dir(self) -> Path:
        """Fine-tuning results (``eval --glue/--tasks``)."""
        return self.path / "downstream"

    # --- config, summary, metrics --------------------------------------------------
    def write_config(self, cfg: Config) -> None:
        write_text_atomic(self.config_path, cfg.to_yaml())

    def read_config(self, overrides: list[str] | None = None) -> Config:
        """The run's resolved config (plus ``--set``-style ``overrides``)."""
        from shoestring.config import load_config

        return load_config(self.config_path, overrides)

    def read_config_dict(self) -> dict[str, Any] | None:
        """``config.yaml`` as plain data, unvalidated (None when absent): for reports of runs
        written by other versions."""
        if not self.config_path.is_file():
            return None
        value = read_yaml(self.config_path, "run's config.yaml")
        return value if isinstance(value, dict) else None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.summary_path, summary)

    def add_to_summary(self, key: str, value: Any) -> bool:
        """Set ``key`` in summary.json, atomically (what a caller of `train` learned that the
        loop does not know: the plan's prediction, the device sizing); False when there is
        no summary (the run did not finish)."""
        summary = read_json_object(self.summary_path)
        if summary is None:
            return False
        summary[key] = value
        write_json_atomic(self.summary_path, summary)
        return True

    def read_summary(self) -> dict[str, Any]:
        """``summary.json``; a missing or damaged one is a ShoestringError."""
        value = read_json_object(self.summary_path)
        if value is None:
            raise ShoestringError("the run has no summary.json (still running or interrupted)",
                                  where=str(self.path), fix="let the run finish, or resume it")
        return value

    def data_dir(self) -> str:
        """The data dir the run trained on, from ``summary.json``."""
        try:
            return str(read_json_object(self.summary_path)["data_dir"])  # type: ignore[index]
        except (ShoestringError, KeyError, TypeError):
            raise ShoestringError(
                "cannot read the run's data dir from summary.json (missing or damaged)",
                where=str(self.summary_path), fix="pass --data DATA_DIR",
            ) from None

    def read_metrics(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl`` in the order written (none when absent); see
        ``parse_metrics``."""
        return parse_metrics(self.metrics_path)[0] if self.metrics_path.is_file() else []

    # --- the final model -------------------------------------------------------------
    def save_final(self, model: torch.nn.Module, meta: dict[str, Any],
                   tokenizer_path: str | Path) -> Path:
        """Write ``final/`` atomically: weights (safetensors, fp32), model meta, tokenizer."""
        import torch

        from shoestring.fsutil import save_safetensors

        state = {k: v.detach().to("cpu", torch.float32).contiguous()
                 for k, v in model.state_dict().items()}
        with building_dir(self.final_dir) as tmp:
            save_safetensors(state, tmp / "model.safetensors", metadata={"format": "pt"})
            write_json_atomic(tmp / "config.json", meta)
            shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        return self.final_dir

    def family(self) -> families.FamilySpec | None:
        """The model family of the final model (None when there is none to read)."""
        meta = json_object_or_none(self.final_dir / "config.json") or {}  # damaged: none
        try:
            return families.by_architecture(meta.get("architecture"))
        except ShoestringError:
            return None

    def load_final(self) -> tuple[torch.nn.Module, dict[str, Any]]:
        """The trained model (on CPU, fp32, eval mode) and its meta; the meta's
        "architecture" names the family that builds it."""
        from safetensors.torch import load_file

        from shoestring.config import ModelConfig
        from shoestring.model import build_model

        final = self.final_dir
        if not (final / "model.safetensors").is_file() or not (final / "config.json").is_file():
            raise ShoestringError(
                "no trained model in this run dir (final/ is missing)",
                where=str(self.path),
                fix="train first (shoestring train), or point at a finished run",
            )
        try:
            meta = json.loads((final / "config.json").read_text(encoding="utf-8"))
            families.by_architecture(meta.get("architecture"))  # a known family, or say so
            model = build_model(ModelConfig.model_validate(meta["model"]), meta["vocab_size"])
            model.load_state_dict(load_file(str(final / "model.safetensors")))
        except Exception as e:  # JSON, schema, safetensors and shape errors alike
            why = e.what if isinstance(e, ShoestringError) else f"{type(e).__name__}: {e}"
            raise ShoestringError(
                f"cannot load the trained model ({why})",
                where=str(final),
                fix="the run dir is damaged or from another version; train it again",
            ) from None
        return model.eval(), meta

    def clear_evaluations(self) -> None:
        """Remove what `eval` wrote about an earlier ``final/`` (a resumed run replaces it:
        scores of the old model must not be read as the new one's)."""
        for f in (self.eval_path, self.decoder_eval_path):
            f.unlink(missing_ok=True)
        if self.downstream_dir.is_dir():
            shutil.rmtree(self.downstream_dir)

    # --- checkpoints -----------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (DCP ``.metadata`` and ``state.json``, which is written
        last), oldest first; hidden build folders and older formats are not listed
        (`shoestring.train.checkpoint`)."""
        if not self.checkpoints_dir.is_dir():
            return []
        return sorted(p for p in self.checkpoints_dir.iterdir()
                      if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)
                      and (p / "state.json").is_file() and (p / ".metadata").is_file())


def model_meta(cfg: Config, vocab_size: int, seq_len: int, special_ids: dict[str, int]) -> dict:
    """``final/config.json``: what ``RunDir.load_final`` needs to rebuild the model."""
    return {
        "architecture": cfg.model.family.architecture,
        "model": cfg.model.model_dump(mode="json"),
        "vocab_size": vocab_size,
        "seq_len": seq_len,
        "special_ids": special_ids,
    }


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file, None when absent; damaged or not an object is a ShoestringError."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ShoestringError(f"not valid JSON ({e})", where=str(path),
                              fix="re-create it (train or eval the run again)") from None
    if not isinstance(value, dict):
        raise ShoestringError("expected a JSON object", where=str(path))
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_metrics(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The one reader of ``metrics.jsonl``: (records in the order written, notes).

    Every line must be a JSON object with a numeric ``step`` and a ``loss`` or ``val_loss``;
    anything else is an error naming the line. The one exception is an unterminated last line
    (a run killed mid-write, or still writing), which is skipped with a note.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ShoestringError(f"metrics file is not UTF-8 text ({e.reason})",
                              where=str(path)) from None
    except OSError as e:
        raise ShoestringError(f"cannot read metrics file ({e.strerror})", where=str(path)) from None
    lines = text.split("\n")
    notes: list[str] = []
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith("\n"):
                notes.append(f"skipped an incomplete last line ({number}) of metrics.jsonl")
                continue
            raise ShoestringError(
                f"line {number} is not valid JSON ({e.msg}): {line[:80]!r}",
                where=f"{path}:{number}",
                fix="metrics.jsonl holds one JSON object per line, as `shoestring train` writes it",
            ) from None
        problem = None
        if not isinstance(record, dict):
            problem = f"is a JSON {type(record).__name__}, not an object"
        elif not _number(record.get("step")):
            problem = f"has no numeric 'step' (got {record.get('step')!r})"
        elif not any(_number(record.get(k)) for k in ("loss", "val_loss")):
            problem = "has neither a numeric 'loss' nor a 'val_loss'"
        if problem:
            raise ShoestringError(
                f"line {number} {problem}",
                where=f"{path}:{number}",
                fix="metrics.jsonl holds the records `shoestring train` writes; re-run training",
            )
        records.append(record)
    return records, notes
