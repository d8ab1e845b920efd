"""Launching distributed training: the per-rank entry point and torchrun command lines.

Each process torchrun starts runs `run` with the same arguments; `run` validates the layout
before any process group exists and turns a `ShoestringError` into a message on every rank and
exit code 2, so a bad layout never leaves ranks waiting on each other.

    torchrun --nproc-per-node 8 -m shoestring train --data data/ -o runs/x \\
        --parallel dp=2,tp=2,pp=2 --zero 2
    torchrun --nproc-per-node 2 -m shoestring.train.launch --data data/ -o runs/x --parallel dp=2
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from shoestring.errors import ShoestringError


def run(
    data: str | Path,
    output: str | Path,
    parallel: str,
    *,
    zero: int = 0,
    offload: str | None = None,
    ac: str = "none",
    pp_schedule: str = "1f1b",
    microbatches: int | None = None,
    config: str | Path | None = None,
    sets: list[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> dict:
    """Validate, then train this rank's share with the one trainer (`shoestring.train.loop`)."""
    from rich.console import Console

    from shoestring.config import load_config
    from shoestring.dist.layout import make_layout
    from shoestring.train.loop import train

    layout = make_layout(parallel, zero=zero, offload=offload, ac=ac, pp_schedule=pp_schedule,
                         microbatches=microbatches)
    cfg = load_config(config, sets)
    return train(cfg, data, output, overwrite=overwrite, resume=resume, layout=layout,
                 console=Console(stderr=True, quiet=True))


def torchrun_command(nproc: int, args: list[str], *, module: str = "shoestring.train.launch",
                     script: str | None = None, nnodes: int = 1, rdzv: str | None = None
                     ) -> list[str]:
    """argv for ``torchrun`` running ``module`` (or a ``script``) with ``args`` (single node:
    a private rendezvous on a free local port)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1 and rdzv is None:
        cmd += ["--standalone"]
    else:
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv}"]
    return [*cmd, *([script] if script else ["-m", module]), *args]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m shoestring.train.launch")
    p.add_argument("--data", "-d", required=True)
    p.add_argument("--output", "-o", required=True)
    p.add_argument("--parallel", default="dp=1")
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--offload", default=None)
    p.add_argument("--ac", default="none")
    p.add_argument("--pp-schedule", default="1f1b")
    p.add_argument("--microbatches", type=int, default=None)
    p.add_argument("--config", "-c", default=None)
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--resume", action="store_true")
    return p


def main(argv: list[str] | None = None) -> None:
    a = _parser().parse_args(argv)
    try:
        run(a.data, a.output, a.parallel, zero=a.zero, offload=a.offload, ac=a.ac,
            pp_schedule=a.pp_schedule, microbatches=a.microbatches, config=a.config,
            sets=a.sets, overwrite=a.overwrite, resume=a.resume)
    except ShoestringError as e:
        rank = os.environ.get("RANK", "0")
        print(f"error (rank {rank}): {e.message}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
