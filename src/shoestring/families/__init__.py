"""The model-family registry: ``families.get(name)`` turns a family's name into its spec.

Each family (masked LM, causal LM, contrastive retriever) is one module of constants here;
registering it is one line below. Specs are data (``families/spec.py``); what a family *does*
is registered by name on the floor that owns it (docs/architecture.md). This package imports
nothing of shoestring but ``errors``.
"""

from __future__ import annotations

from typing import Any

from shoestring.errors import ShoestringError
from shoestring.families.clm import CLM
from shoestring.families.contrastive import CONTRASTIVE
from shoestring.families.mlm import MLM
from shoestring.families.rtd import RTD
from shoestring.families.spec import DEFAULT_MASK_RATE, FamilySpec

__all__ = ["CLM", "CONTRASTIVE", "DEFAULT_MASK_RATE", "MLM", "RTD", "FamilySpec", "all_families",
           "by_architecture", "by_hf_model_type", "get", "names", "preset_fields"]

_REGISTRY: dict[str, FamilySpec] = {f.name: f for f in (MLM, CLM, CONTRASTIVE, RTD)}


def names() -> list[str]:
    """The registered family names (the values of model.objective), in registry order."""
    return list(_REGISTRY)


def all_families() -> list[FamilySpec]:
    """Every registered family spec."""
    return list(_REGISTRY.values())


def get(name: str, where: str = "model.objective") -> FamilySpec:
    """The spec of family ``name``; an unknown name is a ShoestringError naming ``where``."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        choices = ", ".join(f"{f.name} ({f.description})" for f in _REGISTRY.values())
        raise ShoestringError(
            f"unknown model family {name!r} (known: {', '.join(_REGISTRY)})", where=where,
            fix=f"use one of: {choices}",
        ) from None


def preset_fields(name: str) -> dict[str, Any]:
    """The ModelConfig fields preset ``name`` sets (objective included); ValueError (shown by
    config validation) when no family has it."""
    for family in _REGISTRY.values():
        if name in family.presets:
            hidden, layers, heads, kv, inter, _ = family.presets[name]
            fields: dict[str, Any] = {"objective": family.name, "hidden_size": hidden,
                                      "num_layers": layers, "num_heads": heads,
                                      "intermediate_size": inter}
            if kv is not None:
                fields["num_kv_heads"] = kv
            return fields
    known = ", ".join(n for f in _REGISTRY.values() for n in f.presets)
    raise ValueError(f"unknown preset {name!r}; presets: {known}")


def _find(attr: str, value: object, where: str) -> FamilySpec:
    for family in _REGISTRY.values():
        if getattr(family, attr) == value:
            return family
    known = ", ".join(str(getattr(f, attr)) for f in _REGISTRY.values())
    raise ShoestringError(f"unknown {attr.replace('_', ' ')} {value!r} (known: {known})",
                          where=where)


def by_architecture(architecture: object, where: str = "final/config.json") -> FamilySpec:
    """The family whose run dirs record ``architecture`` ("shoestring-mlm", ...)."""
    return _find("architecture", architecture, where)


def by_hf_model_type(model_type: object, where: str = "config.json") -> FamilySpec:
    """The family whose Hugging Face export has ``model_type`` ("modernbert", "llama")."""
    return _find("hf_model_type", model_type, where)
