"""Training-data privacy: the memorization audit (`shoestring audit`); see docs/privacy.md.

Canaries are planted by ``data/canaries.py`` (prep), substring dedup is a curation block
(``data/curate/substring.py``) and DP-SGD fine-tuning lives in ``eval/private.py``.
"""
