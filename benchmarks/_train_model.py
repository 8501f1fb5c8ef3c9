"""A Llama-style decoder as pure JAX functions, for benchmarks/bench_train.py.

RoPE, grouped-query attention, SwiGLU MLP, RMSNorm (pre-norm), untied embedding and LM head.
Parameters are a dict of float32 arrays (the master copy); the loss casts them to bfloat16 and
computes in bfloat16 (norms, RoPE and the log-softmax in float32). The layers' parameters are
stacked on a leading axis and run under `jax.lax.scan`, so XLA compiles one layer, whatever
`layers` is. Attention and embedding lookup are arguments: they are what the benchmark compares.

    attention(q, k, v) -> out     q [B, S, heads, head_dim], k and v [B, S, kv_heads, head_dim]
    embed(table, ids) -> x        table [vocab, d_model] bf16, ids [B, S] int32 -> [B, S, d_model]
"""

from __future__ import annotations

import dataclasses

# Llama 3's RoPE base and RMSNorm epsilon.
ROPE_THETA = 500_000.0
NORM_EPS = 1e-5
INIT_STD = 0.02  # normal init of every matrix (GPT-2 / MaxText default scale)

# AdamW as in the Llama recipes (betas 0.9/0.95, weight decay 0.1), gradients clipped to global
# norm 1. A constant learning rate: a schedule changes no timing and no reproducibility question.
LEARNING_RATE = 3e-4
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.95, 1e-8
WEIGHT_DECAY = 0.1
CLIP_NORM = 1.0

# Memory, the default model at seq 32768, batch 1 (bench_train.py's LOSS_CHUNK_TOKENS rests on it):
#   parameters f32 3.6 GB + AdamW moments 7.2 GB + gradients f32 3.6 GB + bf16 copy 1.8 GB ~ 16 GB;
#   activations kept for the backward, ~36k bf16 values per token per layer (x, norms, q, k, v,
#   attention out, gate, up, gate*up) ~ 70 KB x 32768 tokens x 8 layers ~ 19 GB;
#   logits bf16 32768 x 128256 = 8.4 GB, and float32 [tokens, vocab] temporaries of 16.8 GB each
#   in the loss's backward unless it runs in slices (loss_fn's loss_chunks).
# Measured on an H100 80GB (jax 0.11.2, 2026-11-26, 8-step runs): cudnn_gather 4 x 4096 peaked
# at 42.5 GiB with the loss whole, 35.7 GiB in 4 slices; 1 x 32768 needed 81 GiB whole (OOM) and
# peaked at 59.0 GiB in 4 slices (fa3 59.5, dash_detscatter 59.0, dash_onehot 62.9 GiB).
# cudnn_detflag compiled and ran at 4 x 4096 (no IndexError with cuDNN 9.19) but ran out of
# memory at 1 x 32768 even in 4 slices (a 67.7 GiB temporary).


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 128256          # Llama 3's tokenizer
    d_model: int = 2048
    layers: int = 8
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    mlp_hidden: int = 5632       # SwiGLU hidden width (TinyLlama's 2.75 x d_model)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field.name}={value!r} must be a positive int")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads} (GQA)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs)")


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters that take part in matmuls: every layer's projections and the LM head; the
    embedding table is excluded (its lookup does no FLOPs)."""
    attention = cfg.d_model * (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim \
        + cfg.heads * cfg.head_dim * cfg.d_model
    mlp = 3 * cfg.d_model * cfg.mlp_hidden
    return cfg.layers * (attention + mlp) + cfg.d_model * cfg.vocab


def param_count(cfg: ModelConfig) -> int:
    norms = (2 * cfg.layers + 1) * cfg.d_model
    return matmul_params(cfg) + cfg.vocab * cfg.d_model + norms


def training_flops(cfg: ModelConfig, batch: int, seq: int) -> dict:
    """FLOPs of one training step, MaxText's `calculate_tflops_training_per_device` for a dense
    decoder (maxtext_utils.py), with tokens = batch * seq:

        weights   = 3 * 2 * tokens * matmul_params
                  = 3 * (layers * (ffn + qkv + proj) + lm_head), where
                    ffn = 2*tokens*d_model*mlp_hidden*3 (gate, up, down), qkv = 2*tokens*d_model*
                    (heads + 2*kv_heads)*head_dim, proj = 2*tokens*heads*head_dim*d_model,
                    lm_head = 2*tokens*d_model*vocab ("embedding_flops" there; the lookup is free)
        attention = 3 * layers * (4 * batch * seq^2 * heads * head_dim) / 2   (causal: half)

    The 3 is forward + backward (twice the forward). Recomputation (jax.checkpoint) is not counted.
    """
    tokens = batch * seq
    weights = 6 * tokens * matmul_params(cfg)
    attention = 3 * cfg.layers * 4 * batch * seq ** 2 * cfg.heads * cfg.head_dim / 2
    return {"weights": float(weights), "attention": float(attention),
            "total": float(weights + attention)}


def init_params(cfg: ModelConfig, key) -> dict:
    """float32 parameters; matrices ~ N(0, INIT_STD^2), norm scales 1. Layer arrays are stacked
    on a leading `layers` axis (for scan). Deterministic in `key`."""
    import jax
    import jax.numpy as jnp

    L, d, f = cfg.layers, cfg.d_model, cfg.mlp_hidden
    shapes = {
        "wq": (L, d, cfg.heads * cfg.head_dim),
        "wk": (L, d, cfg.kv_heads * cfg.head_dim),
        "wv": (L, d, cfg.kv_heads * cfg.head_dim),
        "wo": (L, cfg.heads * cfg.head_dim, d),
        "w_gate": (L, d, f),
        "w_up": (L, d, f),
        "w_down": (L, f, d),
    }
    keys = jax.random.split(key, len(shapes) + 2)
    layers = {name: INIT_STD * jax.random.normal(k, shape, jnp.float32)
              for (name, shape), k in zip(sorted(shapes.items()), keys)}
    layers["attention_norm"] = jnp.ones((L, d), jnp.float32)
    layers["mlp_norm"] = jnp.ones((L, d), jnp.float32)
    return {
        "embed": INIT_STD * jax.random.normal(keys[-2], (cfg.vocab, d), jnp.float32),
        "layers": layers,
        "final_norm": jnp.ones((d,), jnp.float32),
        "lm_head": INIT_STD * jax.random.normal(keys[-1], (d, cfg.vocab), jnp.float32),
    }


def rms_norm(x, scale):
    import jax
    import jax.numpy as jnp
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + NORM_EPS)
    return (normed * scale.astype(jnp.float32)).astype(x.dtype)


def rotary(x, positions):
    """RoPE on [B, S, heads, head_dim], rotate-half convention (Llama), angles in float32."""
    import jax.numpy as jnp
    half = x.shape[-1] // 2
    inv_freq = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[:, None].astype(jnp.float32) * inv_freq[None, :]   # (S, half)
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def decoder_layer(cfg: ModelConfig, attention, x, layer: dict):
    import jax
    batch, seq, _ = x.shape
    positions = jax.numpy.arange(seq)
    h = rms_norm(x, layer["attention_norm"])
    q = (h @ layer["wq"]).reshape(batch, seq, cfg.heads, cfg.head_dim)
    k = (h @ layer["wk"]).reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
    v = (h @ layer["wv"]).reshape(batch, seq, cfg.kv_heads, cfg.head_dim)
    out = attention(rotary(q, positions), rotary(k, positions), v)
    x = x + out.reshape(batch, seq, cfg.heads * cfg.head_dim) @ layer["wo"]
    h = rms_norm(x, layer["mlp_norm"])
    return x + (jax.nn.silu(h @ layer["w_gate"]) * (h @ layer["w_up"])) @ layer["w_down"]


def nll_sum(logits, targets):
    """Summed next-token cross-entropy: float32 log_softmax, then the targets' log-probabilities
    with take_along_axis, whose transpose writes each row once (a deterministic gradient)."""
    import jax
    import jax.numpy as jnp
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def loss_fn(params: dict, tokens, *, cfg: ModelConfig, attention, embed, loss_chunks: int = 1):
    """Mean cross-entropy; tokens [B, S + 1] int32: inputs tokens[:, :-1], targets tokens[:, 1:].

    The LM head and loss run under a scan over `loss_chunks` slices of the tokens, because the
    whole at once does not fit at 32k tokens x vocab 128256 (OOM on an 80 GB H100, 2026-11-26):
    the bf16 logits are 8.4 GB, and the backward's float32 [tokens, vocab] temporaries 16.8 GB
    each. Per chunk the backward keeps the bf16 logits and recomputes the float32 log-softmax
    (jax.checkpoint: elementwise work, no matmul), so only one chunk's float32 temporaries exist
    at a time. The LM head enters the scan in float32 so that its gradient adds up over the
    chunks in float32, in chunk order.
    """
    import functools

    import jax
    import jax.numpy as jnp
    compute = jax.tree_util.tree_map(lambda w: w.astype(jnp.bfloat16), params)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = embed(compute["embed"], inputs)
    layer = functools.partial(decoder_layer, cfg, attention)
    x, _ = jax.lax.scan(lambda carry, p: (layer(carry, p), None), x, compute["layers"])
    hidden = rms_norm(x, compute["final_norm"])
    count = targets.size
    if count % loss_chunks:
        raise ValueError(f"loss_chunks={loss_chunks} must divide batch*seq={count}")
    hidden = hidden.reshape(loss_chunks, count // loss_chunks, cfg.d_model)
    targets = targets.reshape(loss_chunks, count // loss_chunks)

    def chunk(total, xs):
        h, t = xs
        logits = h @ params["lm_head"].astype(jnp.bfloat16)               # bf16 [chunk, vocab]
        return total + jax.checkpoint(nll_sum)(logits, t), None

    total, _ = jax.lax.scan(chunk, jnp.zeros((), jnp.float32), (hidden, targets))
    return total / count


def make_optimizer():
    import optax
    return optax.chain(
        optax.clip_by_global_norm(CLIP_NORM),
        optax.adamw(LEARNING_RATE, b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY))


def make_train_step(cfg: ModelConfig, attention, embed, optimizer, loss_chunks: int = 1):
    """(params, opt_state, tokens) -> (params, opt_state, loss); jit it with donate_argnums=(0, 1)
    so parameters and Adam moments are updated in place (no second copy of ~11 GB)."""
    import functools

    import jax
    import optax
    loss = functools.partial(loss_fn, cfg=cfg, attention=attention, embed=embed,
                             loss_chunks=loss_chunks)

    def train_step(params, opt_state, tokens):
        value, grads = jax.value_and_grad(loss)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return train_step


def random_batches(seed: int, steps: int, batch: int, seq: int, vocab: int):
    """[steps, batch, seq + 1] int32 uniform token ids from `seed`: the same in every run."""
    import numpy as np
    return np.random.default_rng(seed).integers(0, vocab, (steps, batch, seq + 1), dtype=np.int32)
