"""Runs several distributed training cases inside ONE torchrun launch (tests/test_dist_*.py).

Each case is one `run` call: `train` with the layout its ``--parallel`` flags give (its own
process group, created and destroyed); batching cases per launch saves the ~10 s interpreter
and torch start-up per process on the 2-core CI machine. argv[1]: a JSON list of {"output", "parallel", ...} dicts
(keys as `run`'s keyword arguments); common keys in argv[2] (JSON). A `ShoestringError`
exits 2 with the message, like the CLI.

``"dynamo_stats": true`` in argv[2]: rank 0 prints what TorchDynamo compiled over the
launch (``dynamo-stats {"graphs": ..., "graph_breaks": ...}`` on stderr).

Fault injection (a case key, not a trainer option): ``"nan_loss": [rank, call]`` makes that
rank's ``call``-th micro-batch loss NaN, as a numerical blow-up on one device would.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from rich.console import Console

from shoestring.config import load_config
from shoestring.dist.layout import make_layout
from shoestring.errors import ShoestringError
from shoestring.train.loop import train
from shoestring.train.objectives import OBJECTIVES


def run(data: str, output: str, parallel: str, *, zero: int = 0, offload: str | None = None,
        ac: str = "none", pp_schedule: str = "1f1b", microbatches: int | None = None,
        config: str | None = None, sets: list[str] | None = None, overwrite: bool = False,
        resume: bool = False) -> dict:
    """This rank's share of one case: `train` with the layout ``--parallel`` and its flags give."""
    layout = make_layout(parallel, zero=zero, offload=offload, ac=ac, pp_schedule=pp_schedule,
                         microbatches=microbatches)
    return train(load_config(config, sets), data, output, overwrite=overwrite, resume=resume,
                 layout=layout, console=Console(stderr=True, quiet=True))


def _inject_nan(rank: int, call: int) -> None:
    if int(os.environ.get("RANK", 0)) != rank:
        return
    calls = [0]

    def patched(real):  # noqa: ANN001, ANN202
        def loss(self, model, batch):  # noqa: ANN001, ANN202
            calls[0] += 1
            out = real(self, model, batch)
            return out * torch.tensor(float("nan")) if calls[0] == call else out
        return loss

    for cls in OBJECTIVES.values():
        cls.loss = patched(cls.loss)  # type: ignore[method-assign]


def main() -> None:
    cases = json.loads(sys.argv[1])
    common = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    dynamo_stats = common.pop("dynamo_stats", False)
    for case in cases:
        kw = {**common, **case}
        real = {kind: cls.loss for kind, cls in OBJECTIVES.items()}
        if "nan_loss" in kw:
            _inject_nan(*kw.pop("nan_loss"))
        try:
            run(kw.pop("data"), kw.pop("output"), kw.pop("parallel"), **kw)
        except ShoestringError as e:
            print(f"error: {e.message}", file=sys.stderr, flush=True)
            sys.exit(2)
        finally:
            for kind, cls in OBJECTIVES.items():
                cls.loss = real[kind]  # type: ignore[method-assign]
    if dynamo_stats and int(os.environ.get("RANK", "0")) == 0:
        from torch._dynamo.utils import counters

        stats = {"graphs": counters["stats"]["unique_graphs"],
                 "graph_breaks": sum(counters["graph_break"].values())}
        print(f"dynamo-stats {json.dumps(stats)}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
