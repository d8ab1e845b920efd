"""The replaced-token-detection family (ELECTRA, Clark et al. 2020; DeBERTaV3, He et al. 2021).

A small generator (a masked LM a fraction of the encoder's width and depth) fills the masked
positions with tokens sampled from its own predictions, and the encoder (the discriminator)
learns from every token whether it was replaced. The masking, sparse head, tokenizer, data dirs
and recipe are the masked-LM family's; the generator, its sampling and the embedding sharing
between the two are ``model/detector.py``. What a run keeps for downstream use is the
discriminator, an ordinary encoder: serving, retrieval, fine-tuning and the ModernBERT export
take it as they take a masked-LM run's (``model.detector.as_encoder``).
"""

from __future__ import annotations

from dataclasses import replace

from shoestring.families.mlm import MLM

# ELECTRA's weight of the discriminator's loss beside the generator's (model.rtd_weight)
DISC_WEIGHT = 50.0

RTD = replace(
    MLM,
    name="rtd",
    architecture="shoestring-rtd",
    description="encoder trained by replaced-token detection (ELECTRA / DeBERTaV3)",
    base="mlm",  # trains on mlm data dirs; its discriminator is an mlm encoder
    presets={},  # sizes are the mlm presets': --set model.preset=tiny
    pipeline=False,
    generator=True,
    # ELECTRA's 15% masking and LR 5e-4 in place of the MLM recipe's 40% and 2e-3: at equal
    # compute on this project's CPU they are what let the discriminator learn enough to lead
    # its random-init twin (docs/benchmarks/eval.md, "Replaced-token detection against MLM")
    train_recipe={"mask_rate": 0.15, "lr": 5e-4},
)
