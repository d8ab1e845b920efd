"""Training-data privacy: the memorization audit (`shoestring audit`); see docs/privacy.md.

Canaries are planted by ``prep/canaries.py`` (prep), substring dedup is a curation block
(``prep/curate/substring.py``) and DP-SGD fine-tuning lives in ``eval/private.py``.
"""
