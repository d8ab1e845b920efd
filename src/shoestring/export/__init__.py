"""Hugging Face export and import: ModernBERT for encoders, Llama for decoders (docs/export.md).

``export/hub.py`` is the one entry each way; ``hf.py`` and ``hf_llama.py`` are the per-family
adapters it registers.
"""
