"""Bytes per rank: parameters, gradients, optimizer state and activations for a layout.

What `shoestring plan` needs to pick a layout that fits, and what a user needs to see why one
does not. The accounting, per rank of the *most loaded* pipeline stage:

* **parameters** — fp32 master weights (the trainer keeps fp32 parameters and autocasts),
  split by ``tp`` (matmuls, embeddings; norms are replicated) and ``pp`` (blocks; the first
  stage has the embedding, the last the head and, when tied, a copy of the embedding), and by
  ``dp_shard`` under ZeRO-3 / ZeRO-2 (FSDP2 keeps them sharded at rest). ``params_transient``
  is what FSDP unshards while computing: the whole stage under ZeRO-2 (no reshard after
  forward), about two blocks under ZeRO-3 (the current one and the prefetched next).
* **gradients** — fp32, one per parameter; sharded by ``dp_shard`` under ZeRO-2/3.
* **optimizer** — AdamW's two fp32 moments (8 bytes/param); sharded across all data-parallel
  ranks under ZeRO-1 (ZeroRedundancyOptimizer) and across ``dp_shard`` under ZeRO-2/3.
  ``--offload cpu`` moves sharded parameters, gradients and optimizer state to host memory
  (reported under ``host``).
* **activations** — per layer and sequence, after Korthikanti et al. 2022 ("Reducing
  Activation Recomputation in Large Transformer Models") with attention through fused SDPA
  (no s² score matrix stored) and the GLU's wider input: attention ≈ 2·s·(h + h + q+k+v + h)
  bytes at 16 bits, feed-forward ≈ 2·s·(2h + 4I) gated / 2·s·(2h + 2I) plain; everything
  divided by ``tp`` (sequence parallelism shards the rest). ``selective`` checkpointing drops
  the norm and activation-function outputs; ``full`` keeps only each block's input (plus one
  block recomputed at a time). Microbatches in flight: all of them under GPipe, ``pp`` under
  1F1B/interleaved (first stage). Plus the fp32 logits for the loss.

Validated against tensor sizes measured in real runs (tests/test_dist_parity.py checks the
parameter, gradient and optimizer bytes of every rank exactly); activation figures are the
model above and on GPU should be checked against ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations


from shoestring import families
from shoestring.config import ModelConfig
from shoestring.dist.layout import Layout

_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


def param_counts(cfg: ModelConfig, vocab_size: int) -> dict[str, int]:
    """Parameter counts of the pieces of a `ModelConfig`'s model (matches the real model)."""
    H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    hd = H // cfg.num_heads
    kv = cfg.num_kv_heads or cfg.num_heads
    bias = bool(cfg.bias)
    rms = cfg.norm == "rmsnorm"
    norm = H if (rms or not bias) else 2 * H
    gated = cfg.ffn != "gelu"
    qkv = (cfg.num_heads + 2 * kv) * hd
    attn = H * qkv + H * H + (qkv + H if bias else 0)
    mlp = H * (2 * I if gated else I) + I * H + ((2 * I if gated else I) + H if bias else 0)
    pre = cfg.norm_position == "pre"
    emb_norm = bool(cfg.embedding_norm)
    first_attn_norm_skipped = pre and emb_norm
    block_norms = 2 * norm
    matmul_per_block = attn + mlp - ((qkv + H) if bias else 0) - (
        ((2 * I if gated else I) + H) if bias else 0)
    tied = bool(cfg.tie_embeddings)
    head = 0
    if cfg.family.head_transform:  # the MLM head's dense + norm before the vocabulary
        head = H * H + (H if bias else 0) + norm + (vocab_size if bias else 0)
    positions = cfg.positions
    return {
        "embedding": vocab_size * H,
        "positions": cfg.max_positions * H if positions == "learned" else 0,
        "emb_norm": norm if emb_norm else 0,
        "block": attn + mlp + block_norms,
        "block_matmul": matmul_per_block,
        "blocks": L * (attn + mlp + block_norms) - (norm if first_attn_norm_skipped else 0),
        "final_norm": norm if pre else 0,
        "head": head,
        "untied_output": 0 if tied else vocab_size * H,
        "tied": int(tied),
    }


def generator_params(cfg: ModelConfig, vocab_size: int) -> int:
    """What an RTD model's generator adds to its encoder's parameters (model/detector.py):
    its blocks and norms, the projections from and back to the shared table's width, its head
    norm and bias, the replaced-token output, and under gdes the generator's own table."""
    if not cfg.family.generator:
        return 0
    gen = cfg.generator_config()
    g, c = param_counts(gen, vocab_size), param_counts(cfg, vocab_size)
    H, G, bias = cfg.hidden_size, gen.hidden_size, int(cfg.bias)
    projections = 2 * H * G + bias * (G + H)
    head = c["final_norm"] or c["emb_norm"] or H  # a norm at the table's width
    table = vocab_size * H if cfg.rtd_sharing == "gdes" else 0
    return (g["emb_norm"] + g["blocks"] + g["final_norm"] + projections + head
            + bias * vocab_size + (H + 1) + table)


def memory_per_rank(model_cfg: ModelConfig, vocab_size: int, seq_len: int, micro_batch: int,
                    layout: Layout | None = None, param_dtype: str = "bf16") -> dict[str, int]:
    """Bytes on the busiest rank (see module docstring). ``layout``: None for one device;
    ``param_dtype``: the compute dtype (activations, FSDP's unsharded working copies);
    ``micro_batch``: sequences per forward (per microbatch under pipeline parallelism)."""
    L_ = layout or Layout()
    c = param_counts(model_cfg, vocab_size)
    tp, pp, z = L_.tp, L_.pp, L_.zero
    H, I, T = model_cfg.hidden_size, model_cfg.intermediate_size, seq_len
    act_bytes = _DTYPE_BYTES[param_dtype]
    stages = L_.num_stages
    # the busiest stage: ceil, so an uneven cut (which `layout.validate` rejects) is not hidden
    blocks_per_rank = -(-model_cfg.num_layers // stages) * L_.stages_per_rank
    block_norm = c["block"] - c["block_matmul"]
    block_local = c["block_matmul"] // tp + block_norm
    pre = model_cfg.norm_position == "pre"
    skipped = c["emb_norm"] if pre else 0  # block 0 has no attention norm (a norm's size)
    emb_local = c["embedding"] // tp + c["positions"] + c["emb_norm"] - skipped
    head_local = (c["final_norm"] + c["head"] + c["untied_output"] // tp
                  + (c["embedding"] // tp if c["tied"] and pp > 1 else 0))
    if pp == 1:  # (an RTD generator refuses tp and pp: all of it on every rank)
        params = (emb_local + blocks_per_rank * block_local + head_local
                  + generator_params(model_cfg, vocab_size))
    else:
        first = emb_local + blocks_per_rank * block_local
        last = blocks_per_rank * block_local + head_local
        params = max(first, last)
    shard = L_.dp_shard if L_.fsdp and z >= 2 else 1
    host = 0
    weights = 4 * (params // shard)
    grads = 4 * (params // shard if z >= 2 else params)
    if z == 0:
        optim = 8 * params
    elif z == 1:
        optim = 8 * params // L_.dp
    else:
        optim = 8 * params // shard
    if L_.offload:
        host = weights + grads + optim
        weights = grads = optim = 0
    transient = 0
    if z == 2 and shard > 1:
        transient = params * act_bytes
    elif z == 3 and shard > 1:
        transient = 2 * block_local * act_bytes
    # activations
    kvh = model_cfg.num_kv_heads or model_cfg.num_heads
    hd = H // model_cfg.num_heads
    qkv = (model_cfg.num_heads + 2 * kvh) * hd
    gated = model_cfg.ffn != "gelu"
    attn_elems = T * (H + H + qkv + H)  # norm in, qkv in, q/k/v, sdpa out (= Wo in)
    mlp_elems = T * (2 * H + (4 * I if gated else 2 * I))
    per_layer = (attn_elems + mlp_elems) * act_bytes
    if L_.ac == "selective":
        per_layer -= (2 * T * H + T * I) * act_bytes  # norm outputs, activation output
    elif L_.ac == "full":
        per_layer = T * H * act_bytes
    per_layer = per_layer // tp
    if pp == 1:
        in_flight = 1
    elif L_.pp_schedule == "gpipe":
        in_flight = L_.n_microbatches
    else:
        in_flight = min(L_.n_microbatches, pp)
    activations = per_layer * blocks_per_rank * in_flight * micro_batch
    if L_.ac == "full":  # one block recomputed with its full activations during backward
        activations += (attn_elems + mlp_elems) * act_bytes // tp * micro_batch
    sparse = model_cfg.sparse_prediction
    scored = round(model_cfg.family.head_fraction(sparse, T, families.DEFAULT_MASK_RATE) * T)
    if model_cfg.family.generator:  # the vocabulary logits are the generator's
        activations += memory_per_rank(model_cfg.generator_config(), vocab_size, seq_len,
                                       micro_batch, layout, param_dtype)["activations"]
    else:
        activations += micro_batch * scored * vocab_size * (act_bytes + 4) // tp
    return {"params": weights, "params_transient": transient, "grads": grads, "optimizer": optim,
            "activations": activations, "host": host, "params_per_rank": params,
            "total": weights + transient + grads + optim + activations}


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def available_bytes(device_type: str, local_rank: int = 0) -> int | None:
    """Memory one rank can use: the GPU's total memory on CUDA; on a CPU, the host's
    available memory (MemAvailable; all local ranks share it). None when unknown."""
    if device_type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(local_rank)[1])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(model_cfg: ModelConfig, vocab_size: int, seq_len: int, micro_batch: int,
               layout: Layout,
               precision: str, device_type: str, local_ranks: int = 1,
               headroom: float = 0.9) -> dict[str, int]:
    """Refuse, before any work, a run whose busiest rank needs more memory than this machine
    has (``headroom`` of it), with the numbers. On a CPU the ``local_ranks`` processes of
    this node share the host's memory. Returns the estimate."""
    from shoestring.errors import ShoestringError

    act = "bf16" if precision in ("bf16", "fp16") else "fp32"  # auto: the larger, to be safe
    est = memory_per_rank(model_cfg, vocab_size, seq_len, micro_batch, layout, param_dtype=act)
    need = est["total"] + (est["host"] if device_type == "cuda" else 0)
    sharers = local_ranks if device_type != "cuda" else 1
    have = available_bytes(device_type)
    # what this rank could still use beyond the estimate (train/speed.py sizes eager attention)
    est["spare"] = None if have is None else int(headroom * have / sharers) - need
    if have is not None and need * sharers > headroom * have:
        per = f" per process × {sharers} processes" if sharers > 1 else ""
        raise ShoestringError(
            f"this run needs about {format_bytes(need)}{per} (weights "
            f"{format_bytes(est['params'])}, gradients {format_bytes(est['grads'])}, AdamW "
            f"{format_bytes(est['optimizer'])}, activations {format_bytes(est['activations'])} "
            f"at micro-batch {micro_batch}) but this {device_type.upper()} has "
            f"{format_bytes(have)} {'available' if device_type != 'cuda' else 'in all'}",
            where="model / train.micro_batch_size",
            fix="choose a smaller model (model.preset), a smaller train.micro_batch_size "
            "(gradients accumulate to the same batch), more devices with --parallel and "
            "--zero 3, or plan for this machine: shoestring plan --hardware auto")
    return est
