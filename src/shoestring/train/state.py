"""What a training run knows between two steps, and the checkpoint schema, in one place.

``TrainState`` holds the counters the loop advances (step, tokens, skipped steps, the agreed
budget clock, when the last checkpoint and validation ran, the losses). ``checkpoint_state``
writes it, with the state of the other objects the next step depends on (data cursor, RNG
streams, metrics line count, layout, attention kernel, precision, loss scaler), as the dict a
checkpoint stores; ``resume_state`` reads that dict back (the kernel and the precision are read
where the device and model are built, `run.build_step`), so a resumed run continues exactly
where the saved one stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shoestring.data.loader import Cursor
from shoestring.errors import ShoestringError
from shoestring.train.checkpoint import capture_rng, restore_rng
from shoestring.train.forecast import Curve

RECENT_LOSSES = 200  # losses a checkpoint keeps, for the resumed run's tail mean


@dataclass
class TrainState:
    """The loop's counters; ``elapsed`` is the budget clock every rank agreed on at the end of
    the last step (wall-clock decisions use it so that all ranks take them together)."""

    step: int = 0
    tokens: int = 0
    skipped: int = 0  # non-finite steps skipped, in total
    bad_in_a_row: int = 0
    next_val: float = 0.0  # progress at which the next periodic validation runs
    elapsed: float = 0.0
    last_ckpt_time: float = 0.0  # budget-elapsed seconds at the last checkpoint
    last_ckpt_progress: float = 0.0  # budget progress at the last checkpoint
    first_loss: float | None = None
    losses: list[float] = field(default_factory=list)
    curve: Curve = field(default_factory=Curve)  # what the forecast is fitted on

    def good_step(self, tokens: int, loss: float, lr_factor: float) -> None:
        """Count an optimizer step that was taken at ``lr_factor`` of the peak LR."""
        self.bad_in_a_row = 0
        self.step += 1
        self.tokens += tokens
        self.losses.append(loss)
        self.curve.add(lr_factor, loss)
        self.first_loss = loss if self.first_loss is None else self.first_loss

    def bad_step(self) -> None:
        """Count a step skipped for a non-finite loss or gradient."""
        self.skipped += 1
        self.bad_in_a_row += 1

    def tail_loss(self) -> float:
        """The "train loss" of the bar and the summary: the mean over the last 5% of steps."""
        tail = self.losses[-max(1, len(self.losses) // 20):]
        return sum(tail) / len(tail) if tail else float("nan")


def checkpoint_state(s: TrainState, *, cursor: Cursor, gen: torch.Generator,
                     metrics_lines: int, layout: dict[str, Any], world_size: int,
                     attention: str, precision: str,
                     scaler: torch.amp.GradScaler | None) -> dict[str, Any]:
    """The dict a checkpoint stores beside the weights and optimizer state."""
    state = {
        "step": s.step, "tokens": s.tokens, "skipped": s.skipped, "next_val": s.next_val,
        "elapsed": s.elapsed, "cursor": cursor.to_dict(), "rng": capture_rng(gen),
        "metrics_lines": metrics_lines, "first_loss": s.first_loss,
        "recent_losses": s.losses[-RECENT_LOSSES:], "layout": layout, "world_size": world_size,
        "attention": attention, "precision": precision, "forecast_curve": s.curve.to_dict(),
    }
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    return state


class _Saved(BaseModel):
    """The keys `resume_state` needs, with their types: what a hand-edited or damaged
    ``state.json`` is checked against before anything is built from it."""

    model_config = ConfigDict(extra="allow", strict=True)
    step: int = Field(ge=0)
    tokens: int = Field(ge=0)
    skipped: int = Field(ge=0)
    next_val: float = Field(allow_inf_nan=False)
    elapsed: float = Field(ge=0, allow_inf_nan=False)
    cursor: dict[str, int]
    rng: dict[str, Any]
    metrics_lines: int = Field(ge=0)


def check_state(state: Any, where: str) -> None:
    """Refuse a checkpoint state that `resume_state` could not read back, naming the field
    (a ShoestringError: exit 2, no traceback)."""
    try:
        _Saved.model_validate(state)
    except ValidationError as e:
        err = e.errors()[0]
        field_name = ".".join(str(x) for x in err["loc"]) or "the file"
        got = f" (got {err['input']!r})" if "input" in err and err["type"] != "missing" else ""
        raise ShoestringError(
            f"the checkpoint's state is invalid: {field_name}: {err['msg']}{got}", where=where,
            fix="delete this checkpoint folder to resume from the one before") from None


def check_cursor(state: dict[str, Any], sequences: int, where: str, data_dir: Path) -> None:
    """Refuse a saved data cursor past the end of the data being resumed on (a ShoestringError:
    exit 2). Each epoch is ``sequences`` long (a mixture's too) and a saved cursor always
    points inside one, so an offset at or past it means another, larger data dir or an edited
    state.json: the loader would silently start the next epoch instead."""
    offset = state["cursor"].get("offset", 0)
    if not 0 <= offset < sequences:
        raise ShoestringError(
            f"the checkpoint's data cursor cursor.offset is {offset:,}, outside the data: "
            f"the train split of {data_dir} holds {sequences:,} sequences (offsets 0 to "
            f"{sequences - 1:,})", where=where,
            fix="resume with --data set to the data dir this run trained on; or delete this "
            "checkpoint folder to resume from the one before")


def resume_state(state: dict[str, Any], progress_at_save: float, gen: torch.Generator,
                 scaler: torch.amp.GradScaler | None,
                 where: str = "state.json") -> tuple[TrainState, Cursor]:
    """``checkpoint_state``'s dict back: the counters and the data cursor; restores the RNG
    streams into ``gen`` (and the global ones) and the loss scaler in place."""
    restore_rng(state["rng"], gen, where)
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    s = TrainState(step=state["step"], tokens=state["tokens"], skipped=state["skipped"],
                   next_val=state["next_val"], elapsed=state["elapsed"],
                   last_ckpt_time=state["elapsed"], last_ckpt_progress=progress_at_save,
                   first_loss=state.get("first_loss"),
                   losses=list(state.get("recent_losses", [])),
                   curve=Curve.from_dict(state.get("forecast_curve"), state["step"]))
    return s, Cursor(**state["cursor"])
