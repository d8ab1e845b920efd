"""Curation blocks for `prep`: normalize, filter, dedup, decontaminate (see docs/data.md).

``Curator`` (in ``pipeline``) is the one entry point ``prep`` uses; each block module can be
used and tested on its own.
"""

from __future__ import annotations

from shoestring.prep.curate.blocks import Block, BlockStats, Drop, Example
from shoestring.prep.curate.curator import Curator

__all__ = [
    "Block",
    "BlockStats",
    "Curator",
    "Drop",
    "Example",
]
