"""The body of `shoestring export`: a Hugging Face folder (`export.hub`) and its table, or an
encoder's or classifier's forward pass as ONNX (`inference.onnx_runtime`, which needs this
floor's engine: why the body lives here and not in ``export/``)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from shoestring import families
from shoestring.consoles import err, out
from shoestring.errors import ShoestringError


def run(run_dir: Path, output: Path, *, overwrite: bool, fmt: str) -> None:
    """Export ``run_dir`` to ``output`` in ``fmt`` (hf or onnx) and say what was written."""
    if fmt == "onnx":
        from shoestring.inference.engine import load_engine
        from shoestring.inference.onnx_runtime import export_folder

        path = export_folder(load_engine(run_dir), output, overwrite=overwrite)
        err.print(f"exported {path}: model.onnx (fp32), model.int8.onnx, tokenizer.json, "
                  "onnx.json (inputs and outputs)", markup=False, highlight=False)
        return
    if fmt != "hf":
        raise ShoestringError(f"{fmt!r} is not an export format", where="--format",
                              fix="use hf or onnx")
    from shoestring.export.hub import export_run

    path = export_run(run_dir, output, overwrite=overwrite)
    cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    t = Table(title=f"exported {path}", show_header=False)
    t.add_row("architecture", f"{cfg['architectures'][0]} (model_type {cfg['model_type']})")
    t.add_row("size", f"{cfg['num_hidden_layers']} layers × {cfg['hidden_size']} hidden, "
              f"{cfg['num_attention_heads']} heads, {cfg['intermediate_size']} GLU")
    t.add_row("vocabulary", f"{cfg['vocab_size']:,}")
    auto = families.by_hf_model_type(cfg["model_type"], where=str(path)).hf_auto_class
    t.add_row("load with", f"{auto}.from_pretrained({str(path)!r})")
    out.print(t)
