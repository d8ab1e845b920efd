"""What a folder is: the one place that tells a run dir from an export, a classifier, a data
dir, a model-repository entry or another project's transformers folder (docs/artifacts.md).

Every command that takes a path (eval, export, serve, the model repository, ``--init-from``)
asks ``identify`` instead of probing files itself, so a folder is recognised the same way
everywhere and a wrong kind of folder gets the same clear error: what the folder *is*, and
what the command wanted. Loading the model behind an artifact belongs to the floor that knows
how (``export.hub.open_model``, ``classifier.load_classifier``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from shoestring import families
from shoestring.errors import ShoestringError
from shoestring.fsutil import json_object_or_none
from shoestring.rundir import RunDir

__all__ = ["SERVABLE", "Artifact", "Kind", "identify"]


class Kind(str, Enum):
    RUN = "run"                  # written by `shoestring train` (trained when final/ exists)
    EXPORT = "export"            # `shoestring export`: a Hugging Face folder
    CLASSIFIER = "classifier"    # `shoestring eval`'s fine-tuned classifier folder
    DATA = "data"                # `shoestring prep`
    REPOSITORY = "repository"    # one version of a model-repository entry (NAME/N/)
    HF_ENCODER = "hf-encoder"    # a transformers folder of an encoder not written by us
    HF_DECODER = "hf-decoder"    # a transformers folder of a decoder (or seq2seq) not ours


DESCRIBE = {
    Kind.RUN: "a run dir (written by shoestring train)",
    Kind.EXPORT: "a Hugging Face export (config.json + model.safetensors)",
    Kind.CLASSIFIER: "a classifier folder (written by shoestring eval)",
    Kind.DATA: "a data dir (written by shoestring prep)",
    Kind.REPOSITORY: "a model-repository version (NAME/N/)",
    Kind.HF_ENCODER: "a transformers encoder folder (config.json + weights, e.g. BERT)",
    Kind.HF_DECODER: "a transformers decoder folder (shoestring serves decoders only from its "
                     "own runs and exports)",
}
# The folders a model can be served (and embedded) from: `inference.engine.load_engine`'s.
SERVABLE = (Kind.RUN, Kind.EXPORT, Kind.CLASSIFIER, Kind.HF_ENCODER)
# The weights a transformers folder may hold (save_pretrained's names, sharded or not).
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json")
# config.json "architectures" suffixes of models that generate (not encoders).
_GENERATING = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


@dataclass(frozen=True)
class Artifact:
    """A folder and what it is; ``path`` is canonical (a run's ``final/`` names the run)."""

    kind: Kind
    path: Path

    @property
    def trained(self) -> bool:
        """A model can be loaded from it (a run dir only once ``final/`` is written)."""
        if self.kind is Kind.RUN:
            return (RunDir(self.path).final_dir / "config.json").is_file()
        if self.kind in (Kind.HF_ENCODER, Kind.HF_DECODER):
            return any((self.path / name).is_file() for name in HF_WEIGHTS)
        return self.kind is not Kind.DATA

    @property
    def model_dir(self) -> Path:
        """The folder holding the weights, ``config.json`` and ``tokenizer.json``."""
        if self.kind is Kind.RUN:
            return RunDir(self.path).final_dir
        return self.path

    @property
    def tokenizer_path(self) -> Path:
        return self.model_dir / "tokenizer.json"


def _kind(path: Path) -> Kind | None:
    run = RunDir(path)
    if run.is_run or (run.final_dir / "config.json").is_file():
        return Kind.RUN
    if (path / "config.json").is_file():
        cfg = json_object_or_none(path / "config.json") or {}
        if cfg.get("architecture") == "shoestring-classifier":
            return Kind.CLASSIFIER
        if "model_type" in cfg:
            return _transformers_kind(cfg, path)
    if (path / "manifest.json").is_file():
        manifest = json_object_or_none(path / "manifest.json") or {}
        if str(manifest.get("format", "")).startswith("shoestring-data/"):
            return Kind.DATA
        if manifest.get("kind") in ("run", "folder") and (path / "model").is_dir():
            return Kind.REPOSITORY
    return None


def _transformers_kind(cfg: dict, path: Path) -> Kind:
    """A folder with a transformers config.json: ours (the model types `shoestring export`
    writes, with their weights: as before), else an encoder or a decoder by its config."""
    ours = {f.hf_model_type for f in families.all_families()}
    if cfg["model_type"] in ours and (path / "model.safetensors").is_file():
        return Kind.EXPORT
    archs = cfg.get("architectures") or []
    generating = any(isinstance(a, str) and a.endswith(_GENERATING) for a in archs)
    if generating or cfg.get("is_decoder") or cfg.get("is_encoder_decoder"):
        return Kind.HF_DECODER
    return Kind.HF_ENCODER


def identify(path: str | Path, *, want: tuple[Kind, ...] | None = None,
             command: str = "this command", trained: bool = False) -> Artifact:
    """What ``path`` is; with ``want``, a ShoestringError unless it is one of those kinds
    (and, with ``trained``, holds a model). ``final/`` of a run names the run itself."""
    path = Path(path)
    if path.name == "final" and _kind(path.parent) is Kind.RUN:
        path = path.parent
    if not path.exists():
        raise ShoestringError("not found (no such folder)", where=str(path),
                              fix="check the path")
    if not path.is_dir():
        raise ShoestringError("not a folder", where=str(path),
                              fix=f"give {command} a folder: " + _wanted(want))
    kind = _kind(path)
    if kind is None:
        missing = "final/ is missing, and there is no config.json or manifest.json"
        raise ShoestringError(f"not a model folder ({missing})", where=str(path),
                              fix=f"give {command} " + _wanted(want))
    artifact = Artifact(kind, path)
    if want is not None and kind not in want:
        raise ShoestringError(f"this is {DESCRIBE[kind]}, not {_wanted(want)}",
                              where=str(path), fix=f"give {command} {_wanted(want)}")
    if trained and not artifact.trained and kind is not Kind.RUN:
        raise ShoestringError(
            "no weights in this folder (none of " + ", ".join(HF_WEIGHTS) + ")",
            where=str(path), fix="copy the model's weights in beside its config.json")
    if trained and not artifact.trained:
        raise ShoestringError(
            "no trained model in this run dir (final/ is missing)", where=str(path),
            fix="train first (shoestring train), or point at a finished run")
    return artifact


def _wanted(want: tuple[Kind, ...] | None) -> str:
    kinds = want or tuple(Kind)
    return " or ".join(DESCRIBE[k] for k in kinds)
