"""Replaced-token detection (ELECTRA, Clark et al. 2020; DeBERTaV3, He et al. 2021) as one module.

``ReplacedTokenDetector`` holds a small generator and the encoder being trained (the
discriminator, an ordinary ``MaskedLM``), so the one training loop, DDP/FSDP2 wrapping,
checkpoints and resume take it like any model. One forward pass:

1. the generator scores the masked positions (an MLM, its loss the generator's);
2. a token is drawn at each masked position from the generator's distribution, by inverse
   CDF at a uniform the batch carries (drawn with the masks, so a step's replacements do not
   depend on how it is split into micro-batches or ranks); nothing flows back through it;
3. the discriminator reads the row with those tokens in place and scores every token as
   replaced or original (a tokens' sample equal to the original counts as original).

Embedding sharing (``model.rtd_sharing``): ``plain`` (ELECTRA) gives both one token table,
which both losses train; ``gdes`` (DeBERTaV3's gradient-disentangled sharing) gives the
discriminator ``stop_gradient(E_gen) + E_delta`` with ``E_delta`` starting at zero, so the
discriminator's loss does not pull the generator's table. The generator is narrower than the
table; like ELECTRA's it projects the shared embeddings into its width and its head back out.

The RTD output is a linear layer on the discriminator's own head transform (dense, GELU,
norm), so what downstream use gets (`as_encoder`) is a plain ``MaskedLM`` with nothing left
over: serve, retrieval, fine-tuning and the ModernBERT export take it unchanged. Its MLM head
(that transform and the tied embeddings) was never trained to fill masks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shoestring.config import ModelConfig
from shoestring.families import MLM
from shoestring.model.encoder import MaskedLM, at_positions
from shoestring.model.layers import Trunk, make_norm


class Generator(Trunk):
    """A small masked-LM encoder that reads and predicts through a token table of another
    width (``table_cfg.hidden_size``), given at each call: ELECTRA's projected generator."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, table_cfg: ModelConfig) -> None:
        super().__init__(cfg, vocab_size)
        self.tok_embeddings = None  # the shared table is passed to forward
        E, H = table_cfg.hidden_size, cfg.hidden_size
        self.embed_proj = nn.Linear(E, H, bias=cfg.bias)
        self.head_dense = nn.Linear(H, E, bias=cfg.bias)
        self.head_norm = make_norm(table_cfg)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab_size)) if cfg.bias else None
        self.reset_parameters()

    def forward(self, input_ids: Tensor, positions: Tensor, table: Tensor) -> Tensor:
        """Logits (B, k, V) at ``positions`` (B, k) of rows ``input_ids`` (B, T)."""
        hidden = self.run(input_ids, embedded=self.embed_proj(F.embedding(input_ids, table)))
        h = self.head_norm(F.gelu(self.head_dense(at_positions(hidden, positions))))
        return F.linear(h, table, self.decoder_bias)


def sample_tokens(logits: Tensor, uniforms: Tensor) -> Tensor:
    """A token per row of ``logits`` (..., V) drawn from their softmax by inverse CDF at
    ``uniforms`` (...) in [0, 1): deterministic given the uniforms, no gradient."""
    cdf = logits.detach().float().softmax(-1).cumsum(-1)
    picked = torch.searchsorted(cdf, uniforms.float().unsqueeze(-1).contiguous()).squeeze(-1)
    return picked.clamp_(max=logits.shape[-1] - 1)


class ReplacedTokenDetector(nn.Module):
    """Generator + discriminator (model.objective=rtd). ``forward`` returns the generator's
    logits at the masked positions, the discriminator's replaced-token logits at every
    position, and which tokens were replaced."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        disc_cfg = cfg.model_copy(update={"objective": "mlm"})
        self.discriminator = MaskedLM(disc_cfg, vocab_size)
        self.generator = Generator(cfg.generator_config(), vocab_size, disc_cfg)
        self.rtd_out = nn.Linear(cfg.hidden_size, 1)
        nn.init.trunc_normal_(self.rtd_out.weight, std=cfg.init_std, a=-3 * cfg.init_std,
                              b=3 * cfg.init_std)
        nn.init.zeros_(self.rtd_out.bias)
        d = self.discriminator
        for part in (d.decoder, d.decoder_bias):  # the vocabulary output: no RTD loss reaches it
            if part is not None:
                part.requires_grad_(False)
        self.generator_embeddings: nn.Parameter | None = None
        if cfg.rtd_sharing == "gdes":
            self.generator_embeddings = nn.Parameter(d.tok_embeddings.weight.detach().clone())
            with torch.no_grad():
                d.tok_embeddings.weight.zero_()  # E_delta

    def generator_table(self) -> Tensor:
        """The token table the generator reads and predicts with."""
        if self.generator_embeddings is not None:
            return self.generator_embeddings
        return self.discriminator.tok_embeddings.weight

    def discriminator_table(self) -> Tensor:
        """The discriminator's token table: the shared one, or (gdes) stop_gradient(E_gen)
        plus its own delta."""
        delta = self.discriminator.tok_embeddings.weight
        if self.generator_embeddings is None:
            return delta
        return self.generator_embeddings.detach() + delta

    def forward(self, inputs: Tensor, positions: Tensor, targets: Tensor,
                uniforms: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``inputs`` (B, T) masked rows, ``positions``/``targets``/``uniforms`` (B, M) → the
        generator's logits (B, M, V), the discriminator's logits (B, T), replaced (B, T)."""
        table = self.generator_table()
        gen_logits = self.generator(inputs, positions, table)
        sampled = sample_tokens(gen_logits, uniforms)
        corrupted = inputs.scatter(1, positions, sampled)
        replaced = torch.zeros_like(inputs, dtype=torch.bool).scatter_(
            1, positions, sampled != targets)
        d = self.discriminator
        hidden = d.run(corrupted, embedded=F.embedding(corrupted, self.discriminator_table()))
        disc_logits = self.rtd_out(d.head_norm(F.gelu(d.head_dense(hidden)))).squeeze(-1)
        return gen_logits, disc_logits, replaced

    def load_encoder(self, state: dict[str, Tensor]) -> None:
        """Start the discriminator from a masked-LM encoder's weights (``--init-from``); under
        gdes its token table becomes the shared one, E_delta zero. The generator and the
        replaced-token output stay as initialised."""
        d = self.discriminator
        d.load_state_dict(state)
        if self.generator_embeddings is not None:
            with torch.no_grad():
                self.generator_embeddings.copy_(d.tok_embeddings.weight)
                d.tok_embeddings.weight.zero_()

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters of both parts; ``non_embedding`` leaves out the token tables."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.discriminator.tok_embeddings.weight.numel()
            if self.generator_embeddings is not None:
                n -= self.generator_embeddings.numel()
        return n


def as_encoder(model: nn.Module, meta: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """What downstream use takes from a model and its ``final/config.json`` meta: an RTD
    model's discriminator as a plain masked-LM encoder (its token table materialised:
    E_gen + E_delta under gdes) with an mlm meta; any other model as it is."""
    if not isinstance(model, ReplacedTokenDetector):
        return model, meta
    d = model.discriminator
    encoder = MaskedLM(d.cfg, d.tok_embeddings.num_embeddings)
    state = d.state_dict()
    state["tok_embeddings.weight"] = model.discriminator_table().detach().clone()
    encoder.load_state_dict(state)
    encoder.train(model.training)
    return encoder, {**meta, "architecture": MLM.architecture,
                     "model": d.cfg.model_dump(mode="json")}
