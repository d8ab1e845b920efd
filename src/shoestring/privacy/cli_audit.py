"""The body of `shoestring audit`: run the memorization audit and print its table."""

from __future__ import annotations

from pathlib import Path

from shoestring.consoles import err, out
from shoestring.privacy.audit import AuditSettings, audit, audit_table


def run(run_dir: Path, data: Path, *, candidates: int, sequences: int, extract: int) -> None:
    """Audit ``run_dir`` against the canaries and splits of ``data``; audit.json is written."""
    settings = AuditSettings(candidates=candidates, sequences=sequences, extract=extract)
    out.print(audit_table(audit(run_dir, data, settings, console=err)))
    out.print(f"written: {run_dir / 'audit.json'}")
