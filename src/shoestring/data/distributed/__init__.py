"""`shoestring prep --executor ray`: the prep pipeline on a Ray cluster (see executor.py).

Importing this package does not import Ray; running it needs ``pip install 'shoestring[ray]'``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RayOptions", "plan_ray", "run_ray"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shoestring.data.distributed import executor

        return getattr(executor, name)
    raise AttributeError(name)
