"""Run a bench's pretraining and fine-tuning jobs as subprocesses, a few at a time.

The downstream benches (``transfer_curve.py``, ``recipe_ablations.py``) need hours of
training. On a 2-core machine two one-thread jobs side by side do about twice the work of one
two-thread job in the same wall clock (a one-thread run of the default model trains at about
half the tokens/s of a two-thread one), so they run each job as its own process with
``OMP_NUM_THREADS`` set, ``slots`` at a time, each after the jobs it depends on. A job may
ask for more threads than the rest (a fine-tune that should use the whole machine once the
timed pretraining is over); it then takes that many slots. Each job's output goes to
``logs/<job>.log``; a job whose dependency failed is not started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    """A timestamped progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Scheduler:
    """Jobs (a name, an argv, the names they wait for, their threads) run in the order added,
    as slots free. With ``threads`` set, each slot is that many threads; otherwise a job runs
    with torch's default threads and takes one slot."""

    def __init__(self, slots: int, threads: int | None) -> None:
        self.slots, self.threads = slots, threads
        self.jobs: list[tuple[str, list[str], list[str], int | None]] = []

    def add(self, name: str, argv: list[str], after: list[str] | None = None,
            threads: int | None = None) -> None:
        """Queue a job; ``threads`` overrides the scheduler's for this job."""
        self.jobs.append((name, argv, [a for a in after or [] if a in self.names()],
                          threads or self.threads))

    def names(self) -> set[str]:
        return {job[0] for job in self.jobs}

    def cost(self, threads: int | None) -> int:
        """Slots a job with ``threads`` threads takes (never more than there are)."""
        if threads is None or self.threads is None:
            return 1
        return min(self.slots, max(1, -(-threads // self.threads)))

    def run(self, logs: Path) -> list[str]:
        """Run every job; returns the names of those that failed or were not started."""
        logs.mkdir(parents=True, exist_ok=True)
        pending, running, used = list(self.jobs), {}, {}
        done: set[str] = set()
        failed: list[str] = []
        while pending or running:
            for name, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    used.pop(name)
                    if proc.returncode == 0:
                        done.add(name)
                    else:
                        failed.append(name)
                    log(f"{name}: {'done' if proc.returncode == 0 else 'FAILED'} "
                        f"(see {logs / name}.log)")
            for job in list(pending):
                name, argv, after, threads = job
                if any(a in failed for a in after):
                    pending.remove(job)
                    failed.append(name)
                    log(f"{name}: not started ({', '.join(a for a in after if a in failed)} failed)")
                elif (sum(used.values()) + self.cost(threads) <= self.slots
                      and all(a in done for a in after)):
                    pending.remove(job)
                    log(f"start {name}" + (f" (OMP_NUM_THREADS={threads})" if threads else ""))
                    env = dict(os.environ)
                    if threads is not None:
                        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
                    with open(logs / f"{name}.log", "ab") as out:
                        running[name] = subprocess.Popen(argv, env=env, stdout=out, stderr=out)
                    used[name] = self.cost(threads)
            time.sleep(2)
        return failed


def finished_downstream(out: Path, tasks: str, seeds: int, max_train: int | None,
                        control: str, protocol: str = "sane") -> dict | None:
    """``out/results.json`` when a complete fine-tuning with exactly these settings wrote it
    (so a rerun of a bench reuses it), else None."""
    import json

    done = out / "results.json"
    if not done.is_file():
        return None
    res = json.loads(done.read_text())
    same = (res.get("complete") and res.get("control") == control and len(res["seeds"]) == seeds
            and res.get("max_train") == max_train and set(res["tasks"]) == set(tasks.split(","))
            and res["protocol"]["name"] == protocol)
    return res if same else None


def pretrain(cfg, data: Path, run: Path, console=None) -> None:  # noqa: ANN001
    """A finished run in ``run``: reused when finished, resumed from its newest checkpoint when
    interrupted (a wall-clock budget keeps its elapsed time), else started."""
    from shoestring.rundir import RunDir
    from shoestring.train.loop import train

    if (run / "final" / "model.safetensors").is_file() and (run / "summary.json").is_file():
        same_settings(cfg, run)
        log(f"reusing {run} (finished)")
        return
    rd = RunDir(run)
    resume = rd.is_run and bool(rd.checkpoints())
    log(f"{'resuming' if resume else 'training'} {run}: budget {cfg.train.budget}")
    train(cfg, data, run, overwrite=not resume, resume=resume, console=console)


def same_settings(cfg, run: Path) -> None:  # noqa: ANN001
    """Refuse to reuse a finished run whose model or train settings differ from what the arm
    asks now (a renamed arm, a changed default): its numbers would be reported under the
    wrong name. The fields compared are those the arm's config was given (``threads`` only
    moves the wall clock)."""
    from shoestring.config import Config
    from shoestring.fsutil import read_yaml

    done = Config.model_validate(read_yaml(run / "config.yaml", "run config"))
    diff = [f"{s}.{k} {getattr(getattr(done, s), k)!r} there, {getattr(getattr(cfg, s), k)!r} now"
            for s in ("model", "train")
            for k in sorted(getattr(cfg, s).model_fields_set - {"threads"})
            if getattr(getattr(done, s), k) != getattr(getattr(cfg, s), k)]
    if diff:
        raise SystemExit(f"{run} was trained with other settings ({'; '.join(diff)}): move it "
                         "aside or give another --work")


def write_table(path: Path, rows: list[dict], args, header: dict) -> None:  # noqa: ANN001
    """A downstream bench's table as JSON (``--out``): its rows, its arguments and the machine."""
    from shoestring.fsutil import write_json_atomic

    write_json_atomic(path, {"rows": rows, "args": {k: str(v) for k, v in vars(args).items()},
                             "machine": header})
