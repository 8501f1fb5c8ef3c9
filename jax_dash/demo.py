"""Reproducible training demo: ``python -m jax_dash.demo``.

Trains a small character-level decoder-only transformer on a text shipped with the package
(``jax_dash/data/corpus.txt``; nothing is downloaded) twice, from the same seed and on the same
batches in the same order, and reports whether the two runs end with bitwise identical parameters
(a SHA-256 of the parameter bytes per run).

With ``--attention jax_dash`` (the default) the attention backward adds its partial sums in a fixed
order, so the two runs must agree bit for bit. ``--attention cudnn`` and ``--attention xla`` use
``jax.nn.dot_product_attention`` instead, for comparison: on a GPU cuDNN's backward accumulates with
atomics, so its two runs usually differ.

The model is written in plain JAX (no Flax/Optax needed) and avoids every other source of
run-to-run noise on a GPU: embeddings and the loss use one-hot matmuls instead of gathers, whose
gradients would be scatter-adds with atomics.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import sys
import time
from importlib import resources
from typing import Callable, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash.attention import SCHEDULES

ATTENTION_CHOICES = ("jax_dash", "cudnn", "xla")
SCHEDULE_CHOICES = SCHEDULES  # jax_dash.attention's, "auto" first
DTYPE_CHOICES = ("float32", "bfloat16", "float16")

# Optimizer constants: AdamW with global-norm clipping, the usual small-transformer recipe.
_LEARNING_RATE = 3e-3
_ADAM_B1 = 0.9
_ADAM_B2 = 0.99
_ADAM_EPS = 1e-8
_WEIGHT_DECAY = 0.01
_CLIP_NORM = 1.0
_WARMUP_STEPS = 10  # linear warm-up avoids the early loss spike of a cold Adam at this rate
_INIT_STD = 0.02
_LAYERNORM_EPS = 1e-5
_MLP_RATIO = 4


def load_corpus() -> str:
    """The demo's training text, read from the package data (never downloaded)."""
    return resources.files("jax_dash").joinpath("data/corpus.txt").read_text(encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Everything that decides a training run's bits."""

    steps: int
    seq: int
    layers: int
    heads: int
    head_dim: int
    batch: int
    dtype: str
    attention: str = "jax_dash"
    schedule: str = "auto"
    seed: int = 0

    def __post_init__(self):
        for name in ("steps", "seq", "layers", "heads", "head_dim", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention={self.attention!r} must be one of {ATTENTION_CHOICES}")
        if self.schedule not in SCHEDULE_CHOICES:
            raise ValueError(f"schedule={self.schedule!r} must be one of {SCHEDULE_CHOICES}")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype={self.dtype!r} must be one of {DTYPE_CHOICES}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a non-negative integer")

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim


def default_config(backend: str | None = None, **overrides) -> DemoConfig:
    """Defaults per backend: under a minute on an idle 2-core CPU; a bigger bf16 model on a GPU.

    The GPU kernels take bf16/fp16 and head_dim 64 or 128, so the GPU default uses those.
    """
    backend = backend or jax.default_backend()
    if backend == "gpu":
        base = dict(steps=200, seq=1024, layers=4, heads=8, head_dim=64, batch=16, dtype="bfloat16")
    else:
        base = dict(steps=200, seq=128, layers=2, heads=4, head_dim=32, batch=8, dtype="float32")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return DemoConfig(**base)


# ----------------------------------------------------------------------------------------------
# Model: pre-LayerNorm decoder, learned positions, tied embeddings.


def init_params(key: jax.Array, cfg: DemoConfig, vocab_size: int) -> dict:
    d, f = cfg.d_model, _MLP_RATIO * cfg.d_model
    keys = iter(jax.random.split(key, 2 + 4 * cfg.layers))

    def normal(shape):
        return _INIT_STD * jax.random.normal(next(keys), shape, jnp.float32)

    layers = []
    for _ in range(cfg.layers):
        layers.append(
            dict(
                ln1=dict(scale=jnp.ones((d,)), bias=jnp.zeros((d,))),
                qkv=normal((d, 3, cfg.heads, cfg.head_dim)),
                out=normal((cfg.heads, cfg.head_dim, d)) / math.sqrt(2 * cfg.layers),
                ln2=dict(scale=jnp.ones((d,)), bias=jnp.zeros((d,))),
                mlp_in=normal((d, f)),
                mlp_out=normal((f, d)) / math.sqrt(2 * cfg.layers),
            )
        )
    return dict(
        embed=normal((vocab_size, d)),
        pos=normal((cfg.seq, d)),
        layers=layers,
        ln_f=dict(scale=jnp.ones((d,)), bias=jnp.zeros((d,))),
    )


def _layer_norm(x, p):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + _LAYERNORM_EPS) * p["scale"] + p["bias"]


def make_attention_fn(cfg: DemoConfig) -> Callable:
    """Causal attention on [batch, seq, heads, head_dim] with the implementation cfg names."""
    scale = 1.0 / math.sqrt(cfg.head_dim)
    if cfg.attention == "jax_dash":
        import jax_dash

        def attend(q, k, v):
            return jax_dash.attention(q, k, v, scale=scale, is_causal=True, schedule=cfg.schedule)

        return attend
    if cfg.attention == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(
            f"attention='cudnn' needs a GPU, but JAX's default backend is "
            f"{jax.default_backend()!r}; use --attention jax_dash or --attention xla here"
        )

    def attend(q, k, v):
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=True, implementation=cfg.attention
        )

    return attend


def forward(params: dict, tokens: jax.Array, cfg: DemoConfig, attend: Callable) -> jax.Array:
    """Logits [batch, seq, vocab] (float32) for int32 tokens [batch, seq]."""
    compute = jnp.dtype(cfg.dtype)
    vocab_size = params["embed"].shape[0]

    def matmul(x, w, spec):
        return jnp.einsum(spec, x.astype(compute), w.astype(compute),
                          preferred_element_type=jnp.float32)

    # One-hot matmul instead of a gather: its gradient is a matmul, not an atomic scatter-add.
    one_hot = jax.nn.one_hot(tokens, vocab_size, dtype=compute)
    x = matmul(one_hot, params["embed"], "bsv,vd->bsd") + params["pos"][: tokens.shape[1]]
    for layer in params["layers"]:
        h = _layer_norm(x, layer["ln1"])
        qkv = matmul(h, layer["qkv"], "bsd,dthe->tbshe").astype(compute)
        attn = attend(qkv[0], qkv[1], qkv[2])
        x = x + matmul(attn, layer["out"], "bshe,hed->bsd")
        h = _layer_norm(x, layer["ln2"])
        h = jax.nn.gelu(matmul(h, layer["mlp_in"], "bsd,df->bsf"))
        x = x + matmul(h, layer["mlp_out"], "bsf,fd->bsd")
    x = _layer_norm(x, params["ln_f"])
    return matmul(x, params["embed"], "bsd,vd->bsv")


def loss_fn(params, inputs, targets, cfg, attend):
    logits = forward(params, inputs, cfg, attend)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    # One-hot product instead of take_along_axis, again to keep the gradient scatter-free.
    target_one_hot = jax.nn.one_hot(targets, logits.shape[-1], dtype=log_probs.dtype)
    return -jnp.mean(jnp.sum(target_one_hot * log_probs, axis=-1))


def init_opt_state(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return dict(mu=zeros, nu=jax.tree.map(jnp.zeros_like, params), count=jnp.zeros((), jnp.int32))


def adamw_update(params, grads, state):
    global_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    clip = jnp.minimum(1.0, _CLIP_NORM / (global_norm + 1e-6))
    grads = jax.tree.map(lambda g: g * clip, grads)
    count = state["count"] + 1
    mu = jax.tree.map(lambda m, g: _ADAM_B1 * m + (1 - _ADAM_B1) * g, state["mu"], grads)
    nu = jax.tree.map(lambda n, g: _ADAM_B2 * n + (1 - _ADAM_B2) * g * g, state["nu"], grads)
    t = count.astype(jnp.float32)
    mu_hat_scale = 1.0 / (1 - _ADAM_B1**t)
    nu_hat_scale = 1.0 / (1 - _ADAM_B2**t)

    learning_rate = _LEARNING_RATE * jnp.minimum(1.0, t / _WARMUP_STEPS)

    def update(p, m, n):
        step = m * mu_hat_scale / (jnp.sqrt(n * nu_hat_scale) + _ADAM_EPS)
        return p - learning_rate * (step + _WEIGHT_DECAY * p)

    new_params = jax.tree.map(update, params, mu, nu)
    return new_params, dict(mu=mu, nu=nu, count=count)


def make_train_step(cfg: DemoConfig) -> Callable:
    attend = make_attention_fn(cfg)

    def train_step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets, cfg, attend)
        params, opt_state = adamw_update(params, grads, opt_state)
        return params, opt_state, loss

    return jax.jit(train_step)


# ----------------------------------------------------------------------------------------------
# Data, hashing, progress.


def make_batches(tokens: np.ndarray, cfg: DemoConfig) -> np.ndarray:
    """[steps, batch, seq + 1] windows; fixed by the seed, so both runs see the same order."""
    if tokens.size < cfg.seq + 2:
        raise ValueError(
            f"seq={cfg.seq} needs a corpus of at least {cfg.seq + 2} characters; "
            f"the corpus has {tokens.size}"
        )
    rng = np.random.default_rng(cfg.seed)
    starts = rng.integers(0, tokens.size - cfg.seq - 1, size=(cfg.steps, cfg.batch))
    return tokens[starts[..., None] + np.arange(cfg.seq + 1)]


def params_digest(params) -> str:
    """SHA-256 over every parameter's path, shape, dtype and raw bytes."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        array = np.asarray(leaf)
        digest.update(f"{jax.tree_util.keystr(path)}:{array.shape}:{array.dtype};".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


class _Progress:
    """A one-line progress bar on stderr (so stdout stays a readable log)."""

    _WIDTH = 24

    def __init__(self, label: str, total: int, stream: TextIO | None, every: int):
        self.label, self.total, self.stream, self.every = label, total, stream, every
        self.start = time.perf_counter()
        self.interactive = bool(stream is not None and stream.isatty())

    def update(self, step: int, loss: float):
        if self.stream is None:
            return
        done = step == self.total
        if not self.interactive and not done and step % self.every:
            return
        filled = self._WIDTH * step // self.total
        bar = "#" * filled + "." * (self._WIDTH - filled)
        rate = step / max(time.perf_counter() - self.start, 1e-9)
        line = f"{self.label} [{bar}] step {step}/{self.total} loss {loss:.4f} ({rate:.1f} step/s)"
        end = "\n" if (done or not self.interactive) else ""
        self.stream.write(("\r" if self.interactive else "") + line + end)
        self.stream.flush()


@dataclasses.dataclass
class RunResult:
    losses: list[float]
    digest: str
    seconds: float
    params: dict


@dataclasses.dataclass
class DemoResult:
    config: DemoConfig
    runs: list[RunResult]

    @property
    def identical(self) -> bool:
        return self.runs[0].digest == self.runs[1].digest


def train_once(cfg: DemoConfig, train_step, batches: np.ndarray, vocab_size: int,
               label: str, progress: TextIO | None) -> RunResult:
    params = init_params(jax.random.key(cfg.seed), cfg, vocab_size)
    opt_state = init_opt_state(params)
    bar = _Progress(label, cfg.steps, progress, every=max(1, cfg.steps // 10))
    losses = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        window = jnp.asarray(batches[step])
        params, opt_state, loss = train_step(params, opt_state, window[:, :-1], window[:, 1:])
        losses.append(float(loss))  # also paces the loop, so the bar shows real progress
        bar.update(step + 1, losses[-1])
    params = jax.block_until_ready(params)
    return RunResult(losses, params_digest(params), time.perf_counter() - start, params)


def run_demo(cfg: DemoConfig, progress: TextIO | None = None, runs: int = 2) -> DemoResult:
    """Train ``runs`` times with identical inputs; the result holds losses and parameter hashes."""
    text = load_corpus()
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    tokens = np.array([index[ch] for ch in text], dtype=np.int32)
    batches = make_batches(tokens, cfg)
    # Compiled once, before the clocks start: both runs execute the very same program.
    params = init_params(jax.random.key(cfg.seed), cfg, len(vocab))
    window = jnp.asarray(batches[0])
    train_step = make_train_step(cfg).lower(
        params, init_opt_state(params), window[:, :-1], window[:, 1:]).compile()
    results = [
        train_once(cfg, train_step, batches, len(vocab), f"run {i + 1}/{runs}", progress)
        for i in range(runs)
    ]
    return DemoResult(cfg, results)


# ----------------------------------------------------------------------------------------------
# Report and command line.


def _first_difference(a: list[float], b: list[float]) -> int | None:
    for step, (x, y) in enumerate(zip(a, b)):
        if np.float32(x).tobytes() != np.float32(y).tobytes():
            return step + 1
    return None


def report(result: DemoResult, out: TextIO) -> None:
    cfg = result.config
    for i, run in enumerate(result.runs):
        out.write(f"run {i + 1}: loss {run.losses[0]:.4f} -> {run.losses[-1]:.4f} "
                  f"in {run.seconds:.1f} s   params sha256 {run.digest}\n")
    first, second = result.runs[0], result.runs[1]
    step = _first_difference(first.losses, second.losses)
    if step is None:
        out.write(f"loss curves: identical at all {cfg.steps} steps\n")
    else:
        out.write(f"loss curves: first differ at step {step} of {cfg.steps}\n")
    if result.identical:
        out.write("final parameters: IDENTICAL, bit for bit: the two runs are reproducible.\n")
    else:
        max_diff = max(
            float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
            for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(second.params))
        )
        out.write(f"final parameters: DIFFERENT (largest difference {max_diff:.3g}): "
                  "the two runs are NOT reproducible.\n")
    reproducible_by_design = cfg.attention == "jax_dash" and cfg.schedule != "atomic"
    if cfg.attention == "cudnn" or cfg.schedule == "atomic":
        who = "cuDNN's" if cfg.attention == "cudnn" else "jax_dash's 'atomic' schedule"
        if result.identical:
            out.write(f"note: {who} runs matched this time, but its attention backward adds "
                      "partial sums with atomics and does not promise it.\n")
        else:
            out.write(f"note: {who} attention backward adds partial sums with atomics in a "
                      "racing order; the default jax_dash schedules give identical runs.\n")
    elif reproducible_by_design and not result.identical:
        out.write("error: jax_dash promises identical runs; please report this as a bug.\n")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jax_dash.demo",
        description="Train a small transformer twice and check that the runs agree bit for bit. "
                    "Defaults depend on the backend: a ~2 minute float32 run on a CPU, a bf16 "
                    "model with seq 1024 on a GPU.",
    )
    parser.add_argument("--attention", choices=ATTENTION_CHOICES, default="jax_dash",
                        help="attention implementation (cudnn and xla: jax.nn.dot_product_attention)")
    parser.add_argument("--steps", type=int, help="training steps per run")
    parser.add_argument("--seq", type=int, help="sequence length (characters)")
    parser.add_argument("--layers", type=int, help="transformer layers")
    parser.add_argument("--heads", type=int, help="attention heads")
    parser.add_argument("--head-dim", type=int, help="head dimension (GPU kernels: 64 or 128)")
    parser.add_argument("--batch", type=int, help="sequences per step")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES,
                        help="compute dtype (GPU kernels: bfloat16 or float16)")
    parser.add_argument("--schedule", choices=SCHEDULE_CHOICES, default="auto",
                        help="jax_dash backward schedule ('atomic' is the non-reproducible baseline)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and batch order")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None, out: TextIO | None = None,
         progress: TextIO | None = None) -> int:
    """Runs the demo; returns 0, or 1 when jax_dash's reproducible runs differ (a bug)."""
    args = _parser().parse_args(argv)
    out = out or sys.stdout
    try:
        cfg = default_config(
            steps=args.steps, seq=args.seq, layers=args.layers, heads=args.heads,
            head_dim=args.head_dim, batch=args.batch, dtype=args.dtype,
            attention=args.attention, schedule=args.schedule, seed=args.seed,
        )
    except ValueError as error:
        _parser().error(str(error))
    if cfg.schedule != "auto" and cfg.attention != "jax_dash":
        _parser().error(f"--schedule {cfg.schedule} applies to --attention jax_dash only")
    out.write(
        f"jax_dash demo on {jax.default_backend()} ({jax.devices()[0].device_kind}): "
        f"char-level decoder, {cfg.layers} layers, {cfg.heads} heads x {cfg.head_dim}, "
        f"seq {cfg.seq}, batch {cfg.batch}, {cfg.steps} steps, {cfg.dtype}, "
        f"attention {cfg.attention}"
        + (f" (schedule {cfg.schedule})" if cfg.attention == "jax_dash" else "")
        + ", seed {}\n".format(cfg.seed)
    )
    out.flush()
    result = run_demo(cfg, progress=None if args.quiet else (progress or sys.stderr))
    report(result, out)
    reproducible_by_design = cfg.attention == "jax_dash" and cfg.schedule != "atomic"
    return 1 if (reproducible_by_design and not result.identical) else 0


if __name__ == "__main__":
    sys.exit(main())
