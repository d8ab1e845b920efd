"""DP-SGD fine-tuning with Opacus: per-example gradient clipping plus Gaussian noise, so the
fine-tuned classifier is (ε, δ)-differentially private with respect to the *task's training
examples* (Abadi et al. 2016). The pretrained encoder's weights are not private: whatever
they memorized of the pretraining corpus stays (docs/privacy.md).

``finetune`` calls ``PrivateTraining.wrap`` after building its optimizer: the model becomes
Opacus' ``GradSampleModule`` (per-example gradients by hooks; our bias-free LayerNorm gets a
sampler here, since Opacus' assumes a bias — its functorch mode handles it too but measured
about 9× slower per step on this CPU), the optimizer a ``DPOptimizer``, and the epoch's
batches come from Opacus' Poisson-sampling ``DPDataLoader`` — the sampling its accountant
assumes. The noise multiplier is solved for the target ε over exactly the number of steps
``finetune`` will take; ``spent()`` is the ε the accountant reports afterwards.

Parameters that the classifier's forward never touches (the unused MLM head) are frozen
first: Opacus needs a per-example gradient for every trainable parameter.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from shoestring.errors import ShoestringError

BACKWARD_HOOK_WARNING = "Full backward hook is firing when gradients are computed"

ACCOUNTANT = "rdp"
GRAD_SAMPLE_MODE = "hooks"  # with our LayerNorm sampler; functorch mode measured 9x slower


@dataclass
class PrivateTraining:
    """DP-SGD settings (``eval.dp_*`` / ``--dp-*``) and, once wrapped, its Opacus engine."""

    epsilon: float
    delta: float = 1e-5
    max_grad_norm: float = 1.0
    engine: Any = field(default=None, repr=False)
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    planned_steps: int | None = None
    _wrapped: Any = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg: Any) -> PrivateTraining | None:
        """From an ``EvalConfig`` (None when ``dp_epsilon`` is unset)."""
        if cfg.dp_epsilon is None:
            return None
        return cls(cfg.dp_epsilon, cfg.dp_delta, cfg.dp_max_grad_norm)

    @classmethod
    def from_options(cls, config: str | None, sets: list[str] | None, epsilon: float | None,
                     delta: float | None) -> PrivateTraining | None:
        """`eval`'s ``--dp-epsilon``/``--dp-delta`` over ``eval.dp_*`` in ``--config`` /
        ``--set`` (validated, errors naming the option)."""
        from shoestring.config import load_config

        flags = {"--dp-epsilon": ("eval.dp_epsilon", epsilon), "--dp-delta": ("eval.dp_delta", delta)}
        given = {k: v for k, v in flags.items() if v[1] is not None}
        keep = [s for s in sets or [] if s.startswith("eval.dp_")]
        return cls.from_config(load_config(config, keep, flags=given).eval)

    def check(self, n_examples: int, batch_size: int, steps: int,
              where: str = "--dp-epsilon") -> float:
        """Refuse what DP-SGD cannot honour, before any training (exit 2 via the CLI);
        returns the noise multiplier that spends ε in ``steps`` steps."""
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ShoestringError(f"ε must be a positive finite number, got {self.epsilon}",
                                  where=where, fix="e.g. --dp-epsilon 8 (omit it for ε = ∞)")
        if not 0 < self.delta < 1:
            raise ShoestringError(f"δ must be between 0 and 1, got {self.delta}",
                                  where="--dp-delta", fix="use δ below 1/n, e.g. 1e-5")
        if self.delta >= 1 / max(1, n_examples):
            raise ShoestringError(
                f"δ = {self.delta:g} is not below 1/n = {1 / n_examples:.2g} for {n_examples:,} "
                "training examples: the guarantee would allow leaking a whole example",
                where="--dp-delta", fix=f"use δ < {1 / n_examples:.1g}")
        if batch_size >= n_examples:
            raise ShoestringError(
                f"batch size {batch_size} is not smaller than the {n_examples:,} training "
                "examples: Poisson subsampling gives no amplification",
                where="--dp-epsilon", fix="use more training examples or a smaller batch")
        if not self.max_grad_norm > 0:
            raise ShoestringError("the clipping norm must be positive",
                                  where="eval.dp_max_grad_norm", fix="e.g. 1.0")
        try:
            from opacus.accountants.utils import get_noise_multiplier
        except ImportError:
            raise ShoestringError("DP-SGD needs the opacus package", where=where,
                                  fix="pip install 'shoestring[privacy]'") from None

        rate = 1 / math.ceil(n_examples / batch_size)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "optimal order is the largest alpha"
                return float(get_noise_multiplier(
                    target_epsilon=self.epsilon, target_delta=self.delta, sample_rate=rate,
                    steps=steps, accountant=ACCOUNTANT))
        except ValueError as e:
            raise ShoestringError(
                f"Opacus cannot reach ε = {self.epsilon:g} at δ = {self.delta:g} in {steps:,} "
                f"steps at sampling rate {rate:.3g} ({e})",
                where=where, fix="raise ε, or train fewer steps / on more examples",
            ) from None

    def check_protocol(self, protocol: str, tasks: list[tuple[str, int]], batch_size: int,
                       epochs: float) -> None:
        """``check`` for every task, and refuse the sweep: choosing among many private runs
        on dev spends privacy the accountant of one run does not count."""
        if protocol != "sane":
            raise ShoestringError(
                f"DP-SGD runs with the sane protocol only (got --protocol {protocol}): a sweep "
                "selects among grid × seeds private runs, which one run's ε does not cover",
                where="--protocol", fix="use --protocol sane with --dp-epsilon")
        for name, n in tasks:
            try:
                self.check(n, batch_size, max(1, math.ceil(math.ceil(n / batch_size) * epochs)))
            except ShoestringError as e:
                raise ShoestringError(f"{name}: {e.what}", where=e.where, fix=e.fix) from None

    def settings(self) -> dict[str, Any]:
        """The requested guarantee (each seed's run gets its own ``report``)."""
        return {"target_epsilon": self.epsilon, "delta": self.delta,
                "max_grad_norm": self.max_grad_norm, "accountant": ACCOUNTANT,
                "grad_sample_mode": GRAD_SAMPLE_MODE,
                "note": "per fine-tuning run; the saved classifier is one of --seeds runs on "
                        "the same examples, chosen by dev score (composition: ≤ seeds × ε)"}

    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, n_examples: int,
             batch_size: int, steps: int, seed: int, probe: Callable[[torch.nn.Module], Any],
             ) -> tuple[torch.nn.Module, torch.optim.Optimizer,
                        Callable[[], Iterator[np.ndarray]]]:
        """Make ``model``/``optimizer`` private for ``steps`` steps; returns them and a function
        giving one epoch of Poisson-sampled index batches. ``probe(model)`` runs one forward
        on a real batch and returns the loss (to find the parameters in use)."""
        from opacus import PrivacyEngine

        self.noise_multiplier = self.check(n_examples, batch_size, steps)
        freeze_unused(model, probe)
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(torch.arange(n_examples)), batch_size=batch_size)
        self.sample_rate = 1 / len(loader)
        self.planned_steps = steps
        if GRAD_SAMPLE_MODE == "hooks":
            _register_samplers()
        # Opacus draws the noise on the parameters' device, so the seeded generator lives there
        gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the secure_mode notice (a seeded run is wanted)
            self.engine = PrivacyEngine(accountant=ACCOUNTANT, secure_mode=False)
            model, optimizer, loader = self.engine.make_private(
                module=model, optimizer=optimizer, data_loader=loader,
                noise_multiplier=self.noise_multiplier, max_grad_norm=self.max_grad_norm,
                poisson_sampling=True, noise_generator=gen, grad_sample_mode=GRAD_SAMPLE_MODE)
        self._wrapped = model

        def epoch() -> Iterator[np.ndarray]:
            for (idx,) in loader:
                yield idx.numpy()

        return model, optimizer, epoch

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` without PyTorch's "Full backward hook is firing when gradients
        are computed with respect to module outputs…" warning: Opacus' per-example hooks
        trigger it on every DP run (the embedding layer's inputs are token ids, which need
        no gradient), and it says nothing the user can act on. Only that message, only here."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=BACKWARD_HOOK_WARNING)
            loss.backward()

    def finish(self) -> dict[str, Any]:
        """After training: take Opacus' hooks off the model; returns ``report()``."""
        self._wrapped._close()
        return self.report()

    def spent(self) -> float:
        """ε the accountant reports for the steps taken (at ``delta``)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(self.engine.get_epsilon(self.delta))

    def report(self) -> dict[str, Any]:
        """What the result records: target and spent ε, δ, noise, clipping, sampling."""
        return {"target_epsilon": self.epsilon, "epsilon_spent": self.spent(),
                "delta": self.delta, "noise_multiplier": self.noise_multiplier,
                "max_grad_norm": self.max_grad_norm, "sample_rate": self.sample_rate,
                "planned_steps": self.planned_steps,
                "steps_accounted": _steps(self.engine), "accountant": ACCOUNTANT,
                "private": "the fine-tuning examples (not the pretrained encoder's data)"}


def layer_norm_grad_sample(layer: torch.nn.LayerNorm, activations: list[torch.Tensor],
                           backprops: torch.Tensor) -> dict[torch.nn.Parameter, torch.Tensor]:
    """Per-example LayerNorm gradients: Opacus' own sampler, which assumes a bias; ours has
    none (``model.bias=false``), so the bias term is skipped when it is absent."""
    import torch.nn.functional as F
    from opacus.utils.tensor_utils import sum_over_all_but_batch_and_last_n

    x = activations[0]
    out = {}
    if layer.weight is not None and layer.weight.requires_grad:
        normed = F.layer_norm(x, layer.normalized_shape, eps=layer.eps)
        out[layer.weight] = sum_over_all_but_batch_and_last_n(normed * backprops,
                                                              layer.weight.dim())
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = sum_over_all_but_batch_and_last_n(backprops, layer.bias.dim())
    return out


def _register_samplers() -> None:
    from opacus.grad_sample import GradSampleModule

    GradSampleModule.GRAD_SAMPLERS[torch.nn.LayerNorm] = layer_norm_grad_sample


def _steps(engine: Any) -> int:
    history = getattr(engine.accountant, "history", [])
    return int(sum(h[-1] for h in history))


def freeze_unused(model: torch.nn.Module, probe: Callable[[torch.nn.Module], Any]) -> list[str]:
    """Set ``requires_grad=False`` on parameters the forward does not reach; returns them."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    probe(model).backward()
    frozen = []
    for name, p in model.named_parameters():
        if p.requires_grad and p.grad is None:
            p.requires_grad_(False)
            frozen.append(name)
        p.grad = None
    return frozen
