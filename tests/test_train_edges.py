"""What a new user meets at the edges of `shoestring train` (issue 22): every check before the
work, through the real CLI — exit code 2, a message naming what and where, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli, tiny_config
from shoestring.rundir import RunDir
from shoestring.train.loop import train

TINY = ["--set", "model.hidden_size=64", "--set", "model.num_layers=2", "--set",
        "model.num_heads=2", "--set", "model.intermediate_size=128"]


def _refused(r, *needles: str) -> None:  # noqa: ANN001
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    text = " ".join(r.stderr.split())
    for n in needles:
        assert n in text, (n, text[-2000:])


def test_a_corrupted_training_shard_is_refused_before_training(pydocs_dir: Path,
                                                               tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(pydocs_dir, data)
    shard = sorted((data / "train").glob("*.bin"))[0]
    raw = bytearray(shard.read_bytes())
    for i in range(100, 110):  # a few flipped bytes, the size unchanged
        raw[i] ^= 0xFF
    shard.write_bytes(bytes(raw))
    r = run_cli("train", "-d", str(data), "-o", str(tmp_path / "run"), "--steps", "2", *TINY)
    _refused(r, shard.name)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_init_from_weights_of_another_tokenizer_is_refused(pydocs_dir: Path,
                                                           tmp_path: Path) -> None:
    src = tmp_path / "src"
    train(tiny_config(steps=1), pydocs_dir, src)
    tok = src / "final" / "tokenizer.json"
    spec = json.loads(tok.read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[-2:]  # same size, two tokens trade ids
    vocab[a], vocab[b] = vocab[b], vocab[a]
    tok.write_text(json.dumps(spec))
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"), "--steps", "1",
                "--init-from", str(src), *TINY)
    _refused(r, "map tokens to different ids", "train.init_from")
    assert not (tmp_path / "run" / "final").exists()


def test_a_plan_for_other_hardware_is_refused_with_the_memory_numbers(pydocs_dir: Path,
                                                                      tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    p = run_cli("plan", "--hardware", "h100", "--devices", "8", "--budget", "24h",
                "-o", str(plan))
    assert p.returncode == 0, p.stderr[-2000:]
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"), "--plan", str(plan))
    # the plan's parallel: section asks for 8 processes; one was started
    _refused(r, "warning: the plan was made for 8 × h100", "8 processes")
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"), "--plan", str(plan),
                "--parallel", "dp=1")  # the layout overridden: the model still does not fit
    _refused(r, "warning: the plan was made for 8 × h100", "this run needs about",
             "but this CPU has", "available")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_an_unwritable_output_is_the_standard_error(pydocs_dir: Path) -> None:
    r = run_cli("train", "-d", str(pydocs_dir), "-o", "/proc/shoestring-run", "--steps", "1",
                *TINY)
    _refused(r, "cannot write the run dir", "/proc/shoestring-run")


def test_another_ranks_write_probe_does_not_make_the_run_dir_look_used(pydocs_dir: Path,
                                                                       tmp_path: Path) -> None:
    # every rank of a job checks the output, then probes it, before any process group: a
    # slow rank must not refuse the folder because a fast one is mid-probe (CI, 8 ranks)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".write-probe-4242").write_bytes(b"")
    train(tiny_config(steps=1), pydocs_dir, run)
    assert (run / "final" / "model.safetensors").is_file()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(other), "--steps", "1", *TINY)
    _refused(r, "is not a shoestring run dir", str(other))
    assert (other / "notes.txt").read_text() == "mine"


def test_a_resumed_run_drops_the_evaluations_of_the_model_it_replaces(pydocs_dir: Path,
                                                                     tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny_config(steps=2), pydocs_dir, run)
    (run / "eval.json").write_text("{}")
    (run / "downstream").mkdir()
    (run / "downstream" / "results.json").write_text("{}")
    train(tiny_config(steps=3), pydocs_dir, run, resume=True)
    assert not (run / "eval.json").exists() and not (run / "downstream").exists()
    assert (run / "final" / "model.safetensors").is_file()


def test_every_run_checkpoints_every_tenth_of_its_budget_by_default(pydocs_dir: Path,
                                                                    tmp_path: Path) -> None:
    cfg = tiny_config(steps=20, keep_checkpoints=20)
    assert cfg.train.checkpoint_every.text == "10%"
    train(cfg, pydocs_dir, tmp_path / "run")
    steps = [int(p.name.removeprefix("step_")) for p in RunDir(tmp_path / "run").checkpoints()]
    assert steps == list(range(2, 21, 2))


def test_a_budget_out_of_range_is_refused_before_a_run_dir_exists(pydocs_dir: Path,
                                                                  tmp_path: Path) -> None:
    for budget in ("0.1steps", "1e400flops", "0.5tok"):
        run = tmp_path / f"run-{budget}"
        r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), "--budget", budget, *TINY)
        _refused(r, "--budget", f"budget '{budget}' is out of range")
        assert not run.exists()
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"),
                "--set", "train.budget=0.1steps", *TINY)
    _refused(r, "train.budget", "out of range")
    assert not (tmp_path / "run").exists()


def test_steps_and_budget_together_are_refused_not_silently_one_of_them(pydocs_dir: Path,
                                                                        tmp_path: Path) -> None:
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"), "--budget", "5m",
                "--steps", "2", *TINY)
    _refused(r, "--budget and --steps", "pass one of them")
    assert not (tmp_path / "run").exists()


def test_sigterm_before_the_first_log_step_shows_real_figures(pydocs_dir: Path,
                                                              tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    log = tmp_path / "stderr.txt"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoestring", "train", "-d", str(pydocs_dir), "-o", str(run),
             "--steps", "100000", "--set", "train.log_every=100000", "--set",
             "train.checkpoint_every=1steps", "--set", "train.compile=false", *TINY],
            stdout=subprocess.DEVNULL, stderr=f, env={**__import__("os").environ,
                                                        "COLUMNS": "200"})
        try:
            deadline = time.monotonic() + 120
            while not RunDir(run).checkpoints() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert RunDir(run).checkpoints(), "no step within 120 s"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        finally:
            proc.kill()
    text = log.read_text()
    bar = [line for line in text.splitlines() if line.startswith("training")][-1]
    assert "loss nan" not in bar and "left ?" not in bar and " 0 tok/s" not in bar, bar
    assert "steps · loss " in bar and "--resume" in text  # a log's plain progress line


def test_a_log_gets_progress_lines_not_only_the_final_bar(pydocs_dir: Path,
                                                         tmp_path: Path) -> None:
    """Without a terminal (a log, CI) rich draws the bar only when it ends; train prints plain
    progress lines there instead (the first step's at once, then at most every 30 s, and the
    last)."""
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"), "--steps", "3",
                "--set", "train.log_every=1", *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.startswith("training ")]
    assert lines and "tok/s" in lines[0] and "of 3 steps" in lines[0]
    assert lines[-1].startswith("training 100.0% of 3 steps")


def test_a_log_hears_from_a_run_between_rare_log_steps(pydocs_dir: Path, tmp_path: Path
                                                       ) -> None:
    """In a log, a run whose log steps are far apart still prints a plain progress line every
    30 s (not only at the end), says up front what its budget does not count, and says what
    it does once the budget is spent."""
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"), "--budget", "35s",
                "--set", "train.log_every=100000", *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join(r.stderr.split())
    lines = [x for x in r.stderr.splitlines() if x.startswith("training ")]
    assert len(lines) >= 3 and lines[-1].startswith("training 100.0% of 35s"), lines
    assert "the budget (35s) counts training steps only: up to 9 validations and a final" in text
    assert "budget spent at step" in text and text.index("budget spent") > text.index(lines[-1])
    load = json.loads((tmp_path / "run" / "summary.json").read_text())["cpu_load"]
    assert load["cores"] >= 1 and load["start"] >= 0 and load["end"] >= 0  # for the table


def _compiler_children(pid: int) -> list[int]:
    """Descendants of ``pid`` that are a C/C++ compiler (inductor's `g++` on a CPU)."""
    kids: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid_, rest = int(text.split(" ", 1)[0]), text.rsplit(")", 1)
        names[pid_] = text[text.index("(") + 1:text.rindex(")")]
        kids.setdefault(int(rest[1].split()[1]), []).append(pid_)
    found, todo = [], [pid]
    while todo:
        for kid in kids.get(todo.pop(), []):
            todo.append(kid)
            if any(c in names.get(kid, "") for c in ("cc1plus", "g++", "c++", "gcc")):
                found.append(kid)
    return found


@pytest.mark.slow
@pytest.mark.heavy
def test_sigterm_to_the_group_while_the_first_step_compiles_checkpoints(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """`timeout`, Ctrl-C and schedulers signal the process group, so inductor's compiler child
    dies with it and the step fails with a compile error: the run must still stop as at any
    signal — a checkpoint, the resume line, exit 128 + SIGTERM — and resume to the end. The
    signal is sent while a compiler child runs (a cold inductor cache makes one)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "shoestring", "train", "-d", str(pydocs_dir), "-o", str(run),
           "--steps", "4", "--set", "train.compile=true", *TINY]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        deadline, seen = time.monotonic() + 400, set()
        while proc.poll() is None and len(seen) < 16:  # inductor survives losing its first
            # compiles (probes of the CPU's vector ISA); a kernel's compile it does not
            seen.update(_compiler_children(proc.pid))
            assert time.monotonic() < deadline, "no kernel compile within 400 s"
            time.sleep(0.02)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        os.killpg(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err and "CppCompileError" not in err, err[-3000:]
    assert "interrupted by SIGTERM at step 0" in err and "--resume" in err, err[-3000:]
    assert RunDir(run).checkpoints()
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), "--resume", "--steps", "4",
                "--set", "train.compile=false", *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


@pytest.mark.slow
def test_ctrl_c_while_the_last_checkpoint_is_saved_stops_cleanly_and_resumes_to_the_end(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """SIGINT as the run says it is saving its last checkpoint (issue 62): no traceback, the
    interrupted line with exit 130 and the checkpoint kept; --resume then finishes the run
    without training past its budget. (Should the signal land once final/ is being written,
    the run finishes and says so.)"""
    from conftest import interrupt_cli

    run = tmp_path / "run"
    rc, err = interrupt_cli(["train", "-d", str(pydocs_dir), "-o", str(run), "--steps", "4",
                             *TINY], when="saving the last checkpoint")
    assert "Traceback" not in err, err[-3000:]
    if rc == 0:  # it had reached final/: finished, and said why it did not stop
        assert "the run was finished first" in err, err[-3000:]
        return
    assert rc == 130, err[-3000:]
    assert "interrupted by SIGINT at step 4" in err and "--resume" in err, err[-3000:]
    assert RunDir(run).checkpoints() and not (run / "final").exists()
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(run), "--resume", "--steps", "4",
                *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    assert (run / "final" / "model.safetensors").is_file()


def test_the_header_promises_the_validations_a_short_run_makes_and_says_it_is_short(
        pydocs_dir: Path, tmp_path: Path) -> None:
    """Issue 62: a 2-step run's header promised 9 validations, and nothing said that a
    handful of steps buys nothing. The count is the loop's own (at most one a step, none at
    the last), and one plain note says the steps are too few and what to do."""
    r = run_cli("train", "-d", str(pydocs_dir), "-o", str(tmp_path / "run"), "--steps", "3",
                *TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join(r.stderr.split())
    assert "the budget (3 steps) counts training steps only: 2 validations and a final" in text
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("val_loss" in x for x in records) == 2 + 1  # what was promised, and no more
    assert text.count("note: this budget buys about 3 steps of this 0.2M-parameter model") == 1
    assert "too few for it to learn much" in text and "--set model.preset=tiny" in text
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["setup_seconds"] > 0  # what the budget leaves out, said at the end too
    assert "s setup: outside the budget)" in " ".join((r.stdout + r.stderr).split())


def test_steps_a_budget_buys_and_the_validations_counted_like_the_loop() -> None:
    """`expected_steps` and `periodic_validations` without a run: a wall-clock budget's steps
    at a measured step time (what the loop calls after its second step), and the count of
    validations for budgets the CLI test does not run."""
    from shoestring.train.budget import Budget
    from shoestring.train.loop import periodic_validations
    from shoestring.train.speed import FEW_STEPS, expected_steps, few_steps_note

    clock = Budget(seconds=40)  # issue 62's run: ~15 s a step of the base model on a CPU
    steps = expected_steps(clock, 4096, 1e9, done=2, elapsed=31.0, step_seconds=15.0)
    assert steps == 2 + 9 / 15 and "about 3 steps of this 78.0M" in few_steps_note(steps, 78_000_000)
    assert expected_steps(clock, 4096, 1e9) is None  # not measured yet: nothing to say
    assert expected_steps(Budget(steps=500, seconds=40), 4096, 1e9, step_seconds=15.0) < 3
    assert expected_steps(Budget(tokens=4096 * 10), 4096, 1e9) == 10
    assert few_steps_note(FEW_STEPS, 10**6) is None
    assert [periodic_validations(0.1, n) for n in (1, 2, 3, 100)] == [0, 1, 2, 9]
    assert periodic_validations(0.1, None) == 9 and periodic_validations(0.0, 100) == 0
    assert periodic_validations(0.1, 100, done=50, next_val=0.6) == 4  # resumed half way
