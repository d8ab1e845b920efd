"""Data-parallel scaling of the one trainer, and the cost of its parallelism seam.

    python bench/scaling.py --data DATA_DIR [--procs 2] [--steps 12] [--preset small]
                            [--baseline-ref GIT_REF] [--repeats 3]

Part 1 — scaling: shoestring on 1 vs N processes (dp=N with DDP and with ZeRO-2), and a plain
PyTorch DDP loop (the peer) on the same model, batch and process count, in one run. Prints
steady-state tokens/s (steps after the first two), the scaling efficiency
tps(N) / (N · tps(1)) and the ratio shoestring / peer. Every process runs one thread
(torchrun's default), so 1 process = 1 core. On CUDA the same script runs one process per GPU
(NCCL).

Part 2 — the seam's overhead in one process (``--baseline-ref``): the same one-process
training with today's trainer and with the trainer of an earlier commit (checked out into a
temporary git worktree and imported from there), alternating A/B ``--repeats`` times; prints
the median step time of each and the overhead. The machine may be shared: the load average
is printed next to the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from common import ROOT, Bench, add_repeats, format_load, load_average, parser

PEER = textwrap.dedent('''
    import json, os, sys, time, torch, torch.distributed as dist, torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from shoestring.config import load_config
    from shoestring.data.datadir import DataDir
    from shoestring.data.loader import BatchLoader
    from shoestring.model import build_model
    from shoestring.train.objectives import objective_for
    cfg = load_config(None, json.loads(sys.argv[2])); data = DataDir(sys.argv[1])
    steps = int(sys.argv[3]); out = sys.argv[4]
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(cfg.model, data.vocab_size).to(dev)
    ddp = DDP(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    obj = objective_for(cfg.model.objective, data.seq_len, data.vocab_size, data.special_ids,
                        cfg.train.mask_rate, cfg.model.sparse_prediction)
    loader = BatchLoader(data.split("train", verify=False), cfg.train.batch_size, 0,
                         rank=rank, world=world, prefetch=0)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for step in range(steps):
        t = time.perf_counter()
        batch = tuple(x.to(dev) for x in obj.make_batch(next(loader), gen))
        loss = obj.loss(ddp, batch); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step(); opt.zero_grad(set_to_none=True)
        if cuda: torch.cuda.synchronize()
        dist.barrier(); times.append(time.perf_counter() - t)
    if rank == 0:
        json.dump({"step_times": times}, open(out, "w"))
    dist.destroy_process_group()
''')


def _torchrun(nproc: int, argv: list[str], timeout: float) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *argv]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode:
        raise SystemExit(f"failed: {' '.join(argv[:3])}\n{p.stderr[-3000:]}")


def ours(data: str, nproc: int, parallel: str, zero: int, sets: list[str], tmp: Path,
         timeout: float) -> float:
    run = tmp / f"ours-{parallel}-z{zero}"
    case = [{"output": str(run), "parallel": parallel, "zero": zero}]
    driver = ROOT / "tests" / "dist_driver.py"
    _torchrun(nproc, [str(driver), json.dumps(case),
                      json.dumps({"data": data, "overwrite": True,
                                  "sets": [*sets, "train.checkpoint_every=null"]})], timeout)
    return steady_tps(run)


def steady_tps(run: Path) -> float:
    """tokens/s between the 2nd and the last training record (warm-up steps left out)."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "loss" in r]
    a, b = recs[1], recs[-1]
    return (b["tokens"] - a["tokens"]) / (b["elapsed_s"] - a["elapsed_s"])


ONE_PROCESS = textwrap.dedent('''
    import json, sys
    from rich.console import Console
    import shoestring
    assert shoestring.__file__.startswith(sys.argv[4]), (shoestring.__file__, sys.argv[4])
    from shoestring.config import load_config
    from shoestring.train.loop import train
    cfg = load_config(None, json.loads(sys.argv[2]))
    train(cfg, sys.argv[1], sys.argv[3], overwrite=True, console=Console(quiet=True))
''')


def one_process(data: str, sets: list[str], run: Path, src: Path, timeout: float) -> float:
    """A one-process run of the trainer whose sources are in ``src`` (this tree, or an
    earlier commit's worktree), in a fresh interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(src)}
    p = subprocess.run([sys.executable, "-c", ONE_PROCESS, data,
                        json.dumps([*sets, "train.checkpoint_every=null", "train.val_every=0",
                                    "train.tensorboard=false"]), str(run), str(src)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode:
        raise SystemExit(f"failed: one process from {src}\n{p.stderr[-3000:]}")
    return steady_tps(run)


def seam_overhead(data: str, sets: list[str], ref: str, repeats: int, tmp: Path,
                  timeout: float) -> tuple[list[float], list[float]]:
    """tokens/s of today's trainer and of the one at ``ref``, alternated ``repeats`` times."""
    old = tmp / "baseline"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), ref],
                   check=True, capture_output=True)
    try:
        now, then = [], []
        for i in range(repeats):
            now.append(one_process(data, sets, tmp / f"now-{i}", ROOT / "src", timeout))
            then.append(one_process(data, sets, tmp / f"then-{i}", old / "src", timeout))
        return now, then
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                       capture_output=True)


def peer(data: str, nproc: int, sets: list[str], steps: int, seq_tokens: int, tmp: Path,
         timeout: float) -> float:
    script, out = tmp / "peer.py", tmp / f"peer-{nproc}.json"
    script.write_text(PEER)
    _torchrun(nproc, [str(script), data, json.dumps(sets), str(steps), str(out)], timeout)
    times = json.loads(out.read_text())["step_times"][2:]
    return seq_tokens * len(times) / sum(times)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--preset", default=None, help="model preset (default: hidden 256, 4 layers)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--baseline-ref", default=None,
                    help="also measure one-process tokens/s against the trainer of this commit")
    add_repeats(ap, 3)
    ap.add_argument("--skip-scaling", action="store_true", help="only the seam overhead")
    a = ap.parse_args()
    from shoestring.data.datadir import DataDir

    seq = DataDir(a.data).seq_len
    model = [f"model.preset={a.preset}"] if a.preset else [
        "model.hidden_size=256", "model.num_layers=4", "model.num_heads=4",
        "model.intermediate_size=768"]
    sets = [*model, f"train.steps={a.steps}", f"train.batch_size={a.batch_size}",
            "train.log_every=1", "train.precision=fp32", "train.threads=1"]
    n = a.procs
    bench = Bench("scaling", a, precision="fp32", threads=1)
    if a.baseline_ref:
        with tempfile.TemporaryDirectory() as d:
            now, then = seam_overhead(a.data, sets, a.baseline_ref, a.repeats, Path(d),
                                      a.timeout)
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        setting = (f"one process, 1 thread, {a.steps} steps × {a.batch_size} × {seq} tokens, "
                   f"{a.repeats} alternating runs each")
        print(f"{setting}; load average {format_load(load_average())}")
        print(f"  trainer now            {', '.join(f'{x:,.0f}' for x in now)} tokens/s "
              f"(median {med(now):,.0f})")
        print(f"  trainer at {a.baseline_ref:<11} {', '.join(f'{x:,.0f}' for x in then)} "
              f"tokens/s (median {med(then):,.0f})")
        overhead = f"seam overhead (step time now / then - 1): {med(then) / med(now) - 1:+.1%}"
        print(f"  {overhead}")
        bench.table([{"trainer": "now", "tokens/s": med(now), "runs": now},
                     {"trainer": f"at {a.baseline_ref}", "tokens/s": med(then), "runs": then}],
                    "seam", formats={"tokens/s": ",.0f", "runs": ",.0f"},
                    notes=[setting, overhead])
    if a.skip_scaling:
        bench.end()
        return
    # the peer neither validates nor writes TensorBoard: the same work for ours
    ours_sets = [*sets, "train.tensorboard=false", "train.val_every=0"]
    runs = {
        "shoestring 1 proc": lambda tmp: ours(a.data, 1, "dp=1", 0, ours_sets, tmp, a.timeout),
        f"shoestring dp={n} (DDP)": lambda tmp: ours(a.data, n, f"dp={n}", 0, ours_sets, tmp,
                                                     a.timeout),
        f"shoestring dp={n} ZeRO-2 (FSDP2)": lambda tmp: ours(a.data, n, f"dp={n}", 2, ours_sets,
                                                             tmp, a.timeout),
        "peer: plain PyTorch 1 proc": lambda tmp: peer(a.data, 1, sets, a.steps,
                                                       a.batch_size * seq, tmp, a.timeout),
        f"peer: plain PyTorch DDP {n} procs": lambda tmp: peer(a.data, n, sets, a.steps,
                                                               a.batch_size * seq, tmp,
                                                               a.timeout),
    }
    rows: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.repeats):  # interleaved, so a change in load hits every row alike
        for name, run in runs.items():
            with tempfile.TemporaryDirectory() as d:
                rows[name].append(run(Path(d)))
    setting = (f"global batch {a.batch_size} × {seq} tokens, {a.steps} steps (first 2 "
               f"skipped), fp32, 1 thread per process, {a.repeats} interleaved rounds (median); "
               "shoestring without TensorBoard and periodic validation, like the peer")
    print(setting)
    med = {k: sorted(v)[len(v) // 2] for k, v in rows.items()}
    for k, v in rows.items():
        print(f"  {k:<36} {med[k]:>10,.0f} tokens/s  ({', '.join(f'{x:,.0f}' for x in v)})")
    one, many = med["shoestring 1 proc"], med[f"shoestring dp={n} (DDP)"]
    peer1, peern = med["peer: plain PyTorch 1 proc"], med[f"peer: plain PyTorch DDP {n} procs"]
    notes = [f"scaling efficiency shoestring dp={n}: {many / (n * one):.2f}  "
             f"(peer: {peern / (n * peer1):.2f})",
             f"ratio shoestring / peer at {n} procs: {many / peern:.2f}; at 1 proc: "
             f"{one / peer1:.2f}  [peer: plain PyTorch loop, DistributedDataParallel on gloo, "
             "the same model, AdamW foreach, clip 0.5, rank-sharded batches]"]
    print("\n".join(notes))
    bench.table([{"run": k, "tokens/s": med[k], "rounds": v} for k, v in rows.items()],
                "scaling", formats={"tokens/s": ",.0f", "rounds": ",.0f"},
                notes=[setting] + notes)
    bench.end()


if __name__ == "__main__":
    main()
