"""`shoestring prep --executor ray`: the prep pipeline on a Ray cluster (see runner.py).

Importing this package does not import Ray; running it needs ``pip install 'shoestring[ray]'``.
"""

from __future__ import annotations

from typing import Any

from shoestring.prep.executor import register


def _ray_executor(options: Any) -> Any:
    from shoestring.prep.ray.runner import RayExecutor

    return RayExecutor(options)


register("ray", _ray_executor)  # prep --executor ray (prep itself names no executor)
