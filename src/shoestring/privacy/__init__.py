"""Training-data privacy (docs/privacy.md): the memorization audit (`shoestring audit`) and
DP-SGD fine-tuning (``dp_sgd.py``, which `eval` and `finetune` call). Canaries are planted by
prep (``prep/canaries.py``); substring dedup is a curation block (``prep/curate/substring.py``).
"""
