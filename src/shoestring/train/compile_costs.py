"""What ``torch.compile`` costs and buys on this machine, per device and step shape, measured
by the runs themselves; `train.speed.choose` decides ``train.compile=auto`` from it.

One constant cannot serve every device: a 2-core CPU compiles the `cram` encoder in ~40 s and
gains ~1.25×, an H100 compiles BERT-base in 16–36 s and gains 1.5–2× (BENCHMARKS.md, GPU).
So every finished run records, under a key naming its device, dtype and step shape, its
steady tokens/s (compiled or not) and, when compiled, what the compile cost: the first step's
time beyond a steady step. The speed-up is the ratio of the two rates once both were measured
for the key; the cost is the latest measured, so a warm inductor cache (a few seconds) makes
the next run compile sooner. A key without a figure borrows the median of the device's other
keys, then `ASSUMED` for the device type. The file is a cache (``$SHOESTRING_HOME/
compile.json``): unreadable or unwritable, it is ignored, and so is any figure in it that is
not a plausible measurement (a wrong type, a boolean, NaN, a rate or cost out of range): a
damaged or hand-edited file costs a run its records, never the run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from shoestring.fsutil import json_cache, json_object_or_none, shoestring_home


@dataclass(frozen=True)
class CompileCost:
    """Seconds a compile adds to the first step, and the steady speed-up it buys."""

    seconds: float
    speedup: float
    source: str  # where each number came from, for the log

    def gain(self, run_seconds: float) -> float:
        """How much faster a run of ``run_seconds`` uncompiled ends when compiled, the compile
        included (0.1: 10% faster; negative: slower)."""
        return run_seconds / (self.seconds + run_seconds / self.speedup) - 1.0


ASSUMED = {
    # cold compiles of 16-36 s on an H100 and an H200; BERT-base 1.59x faster compiled on an
    # H100 (docs/training.md has the figures and where they were measured)
    "cuda": CompileCost(30.0, 1.55, "assumed for a GPU until measured"),
    # ~40 s cold and 1.25x for the cram encoder on a 2-core CPU (docs/training.md)
    "cpu": CompileCost(40.0, 1.25, "assumed for a CPU until measured"),
}
MIN_STEADY_SECONDS = 1.0
"""A run shorter than this after its first step records nothing: its rate is noise."""


def records_path() -> Path:
    return shoestring_home() / "compile.json"


def shape_key(device: str, dtype: str, shape: str) -> str:
    """The record's key: the device's name, the autocast dtype and the step's shape."""
    return f"{device} | {dtype} | {shape}"


# Figures outside these ranges are not measurements (tokens/s; seconds of compiling; the
# ratio of two rates) and are ignored as if absent.
RATE_RANGE = (1e-3, 1e15)
COMPILE_S_RANGE = (0.0, 1e5)
SPEEDUP_RANGE = (1e-3, 1e3)


def _number(x: object, low: float, high: float) -> float | None:
    """``x`` as a float when it is a real number (not a boolean) within [low, high]."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if low <= x <= high else None  # NaN compares false: None


def _entry(records: dict, key: str) -> dict:
    entry = records.get(key)
    return entry if isinstance(entry, dict) else {}


def _measured(entry: dict) -> tuple[float | None, float | None]:
    """(compile seconds, speed-up) that one key's entry measured (None: not yet)."""
    eager = _number(entry.get("eager_tokens_per_s"), *RATE_RANGE)
    compiled = _number(entry.get("compiled_tokens_per_s"), *RATE_RANGE)
    cost = _number(entry.get("compile_s"), *COMPILE_S_RANGE)
    speedup = _number(compiled / eager, *SPEEDUP_RANGE) if eager and compiled else None
    return cost, speedup


def lookup(device_type: str, device: str, dtype: str, shape: str) -> CompileCost:
    """The compile cost and speed-up for this key: measured, borrowed from the same device's
    other shapes, or assumed for the device type (``source`` says which)."""
    records = json_object_or_none(records_path()) or {}
    key = shape_key(device, dtype, shape)
    own = _measured(_entry(records, key))
    prefix = shape_key(device, dtype, "")
    others = [_measured(v) for k, v in records.items()
              if k.startswith(prefix) and k != key and isinstance(v, dict)]
    assumed = ASSUMED["cuda" if device_type == "cuda" else "cpu"]
    found, sources = [], []
    for i, default in enumerate((assumed.seconds, assumed.speedup)):
        theirs = [o[i] for o in others if o[i] is not None]
        if own[i] is not None:
            found.append(own[i])
            sources.append("measured for this shape")
        elif theirs:
            found.append(statistics.median(theirs))
            sources.append(f"measured for {len(theirs)} other shape(s) on this device")
        else:
            found.append(default)
            sources.append(assumed.source)
    source = (sources[0] if sources[0] == sources[1]
              else f"compile {sources[0]}, speed-up {sources[1]}")
    return CompileCost(found[0], found[1], source)


def record(device: str, dtype: str, shape: str, compiled: bool, tokens: int, seconds: float,
           first_step_tokens: int, first_step_s: float) -> dict | None:
    """Add one finished run's measurements (``tokens`` in ``seconds`` of training, of which the
    first step trained ``first_step_tokens`` in ``first_step_s``); returns the key's entry, or
    None when the run was too short to say anything."""
    steady_s = seconds - first_step_s
    if steady_s < MIN_STEADY_SECONDS or tokens <= first_step_tokens:
        return None
    rate = (tokens - first_step_tokens) / steady_s
    key = shape_key(device, dtype, shape)
    with json_cache(records_path()) as records:
        entry = dict(_entry(records, key))
        entry["compiled_tokens_per_s" if compiled else "eager_tokens_per_s"] = rate
        if compiled:
            entry["compile_s"] = max(0.0, first_step_s - first_step_tokens / rate)
        entry["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        records[key] = entry
    return entry
