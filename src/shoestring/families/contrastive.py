"""The contrastive family: the masked-LM encoder trained as a retriever.

Inverse-cloze task (Lee, Chang & Toutanova, "Latent Retrieval for Weakly Supervised Open
Domain QA", 2019) on the user's own packed rows, no labels needed: the query is a contiguous
span of a row, the positive is the rest of the row, and every other row's positive in the
(micro-)batch is a negative (``data/masking.py: inverse_cloze_pairs``,
``model/losses.py: in_batch_loss``). The model, data (mlm-prepped data dirs), weights
(``--init-from`` an mlm run) and serving engine are the masked-LM family's; a run records
architecture ``shoestring-contrastive`` so that `index` and `serve` know it was tuned for
retrieval. It runs no vocabulary head and no pipeline parallelism, and has no HF export yet.
"""

from __future__ import annotations

from dataclasses import replace

from shoestring.families.mlm import MLM

CONTRASTIVE = replace(
    MLM,
    name="contrastive",
    architecture="shoestring-contrastive",
    description="encoder tuned for retrieval (in-batch negatives on inverse-cloze pairs)",
    base="mlm",  # trains on mlm data dirs, starts from (and builds) mlm weights
    presets={},  # sizes are the mlm presets': --set model.preset=tiny
    vocab_head=False,
    pipeline=False,
)
