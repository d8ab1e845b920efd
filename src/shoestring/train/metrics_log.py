"""Where training numbers go: ``metrics.jsonl`` (one JSON record per line) and TensorBoard.

The JSONL file is the record of truth (report, resume and tests read it); TensorBoard is a
view of the same numbers. On resume the file is cut back to the checkpoint's line count, so
a resumed run's file reads exactly like an uninterrupted one's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from shoestring.rundir import RunDir


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool, keep_lines: int = 0) -> None:
        run = RunDir(run_dir)
        self.path = run.metrics_path
        self.lines = 0
        if keep_lines and self.path.is_file():
            kept = self.path.read_text(encoding="utf-8").splitlines(keepends=True)[:keep_lines]
            self.path.write_text("".join(kept), encoding="utf-8")
            self.lines = len(kept)
        self._file = open(self.path, "a" if self.lines else "w", encoding="utf-8")
        self._tb = None
        if tensorboard:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run.tb_dir))

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self.lines += 1
        if self._tb is not None:
            step = int(record["step"])
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    group = "val" if key.startswith("val_") else "train"
                    self._tb.add_scalar(f"{group}/{key}", value, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
