"""The optional libraries retrieval needs, imported with a clear error when missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from shoestring.errors import ShoestringError

_PACKAGES = {"bm25s": "bm25s", "faiss": "faiss-cpu"}


def require(module: str) -> ModuleType:
    """``import module``; missing, a ShoestringError that says what to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ShoestringError(
            f"retrieval needs the {_PACKAGES[module]} package, which is not installed",
            fix="pip install 'shoestring[retrieval]' (or pip install "
            f"{' '.join(_PACKAGES.values())})") from None
