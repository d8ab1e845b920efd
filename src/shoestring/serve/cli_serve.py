"""The body of `shoestring serve`: the options as `ServeSettings`, a warning when the server
listens beyond this machine with no key, then the server until it is stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shoestring.consoles import err
from shoestring.serve.server import serve
from shoestring.serve.settings import make_settings


def run(models: list[str], *, request_timeout: float, body_timeout: float,
        shutdown_timeout: float, idle_timeout: float, index: Path | None, **options: Any) -> None:
    """Serve ``models`` with the command's ``options`` (named as its flags; the timeouts and
    the index dir are renamed and converted to their settings here)."""
    settings = make_settings(
        **options, request_timeout_s=request_timeout, body_timeout_s=body_timeout,
        shutdown_timeout_s=shutdown_timeout, idle_timeout_s=idle_timeout,
        index=str(index) if index else None)
    if not settings.loopback and settings.api_key is None:
        err.print(f"[yellow]warning:[/] listening on {options['host']} without --api-key: anyone "
                  "who can reach this machine can use the model")
    serve(models, settings,
          announce=lambda msg: err.print(msg, markup=False, highlight=False, soft_wrap=True))
