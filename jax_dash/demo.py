"""Reproducible training demo: ``python -m jax_dash.demo``.

Trains a small character-level decoder-only transformer on a text shipped with the package
(``jax_dash/data/corpus.txt``; nothing is downloaded) twice, from the same seed and on the same
batches in the same order, and reports whether the two runs end with bitwise identical parameters
(a SHA-256 of the parameter bytes per run).

The model is a Flax NNX module whose ``nnx.MultiHeadAttention`` layers take jax_dash as their
``attention_fn`` (through ``jax_dash.flax``); an optax AdamW trains it in a ``jax.jit``-compiled step
(NNX's functional API: ``nnx.split`` the model, jit a pure step over the parameters). Needs
``flax`` and ``optax`` (``pip install ".[demo]"`` from a checkout).

With ``--attention jax_dash`` (the default) the attention backward adds its partial sums in a fixed
order, so the two runs must agree bit for bit. On a GPU the demo then trains twice more with
cuDNN's attention (``jax.nn.dot_product_attention(implementation="cudnn")``), whose backward adds
with atomics, so its two runs usually differ. On a CPU there is no such contrast: XLA's CPU
attention is reproducible too. ``--attention cudnn``/``xla`` run one implementation alone.

The rest of the step is reproducible too: the token embedding is ``jax_dash.flax.Embed`` (a
drop-in for ``nnx.Embed`` whose gradient sums in a fixed order, where a gather's gradient is a
scatter-add with atomics on a GPU), and the loss takes its labels with ``take_along_axis`` (one
label per row: no two updates meet). Before training, the demo runs ``jax_dash.check_determinism``
on its training step (the GPU program, from its lowering, and the runs on this machine) and
prints what it found. ``--vocab`` sets the embedding's rows (at least the corpus's characters), to
see the cost of a real vocabulary.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import glob
import sys
import time
from importlib import resources
from typing import Callable, TextIO

import jax
import jax.numpy as jnp
import numpy as np

from jax_dash.attention import SCHEDULES

ATTENTION_CHOICES = ("jax_dash", "cudnn", "xla")
CONTRAST_ATTENTION = "cudnn"  # what a GPU run trains with after jax_dash, for contrast
SCHEDULE_CHOICES = SCHEDULES  # jax_dash.attention's, "auto" first
DTYPE_CHOICES = ("float32", "bfloat16", "float16")

# Optimizer constants (optax): AdamW with global-norm clipping, the usual small-transformer recipe.
_LEARNING_RATE = 3e-3
_ADAM_B1 = 0.9
_ADAM_B2 = 0.99
_ADAM_EPS = 1e-8
_WEIGHT_DECAY = 0.01
_CLIP_NORM = 1.0
_WARMUP_STEPS = 10  # linear warm-up (then cosine decay to a tenth): no early spike of a cold Adam
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
    vocab: int | None = None  # embedding rows; None: the corpus's characters

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
        if self.vocab is not None and (not isinstance(self.vocab, int)
                                       or isinstance(self.vocab, bool) or self.vocab < 1):
            raise ValueError(f"vocab={self.vocab!r} must be a positive integer")

    @property
    def d_model(self) -> int:
        return self.heads * self.head_dim


def default_config(backend: str | None = None, **overrides) -> DemoConfig:
    """Defaults per backend: under a minute on an idle 2-core CPU; a bigger bf16 model on a GPU.

    The GPU kernels take bf16/fp16 and run head_dim 64, 128 and 256 natively, so the GPU default
    uses one of those.
    """
    backend = backend or jax.default_backend()
    if backend == "gpu":
        base = dict(steps=200, seq=1024, layers=4, heads=8, head_dim=64, batch=16, dtype="bfloat16")
    else:
        base = dict(steps=200, seq=128, layers=2, heads=4, head_dim=32, batch=8, dtype="float32")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return DemoConfig(**base)


# ----------------------------------------------------------------------------------------------
# Model: a Flax NNX pre-LayerNorm decoder (learned positions, tied embeddings) whose multi-head
# attention runs jax_dash through its Flax adapter and whose token embedding is
# jax_dash.flax.Embed, trained with an optax AdamW.


def _flax_modules():
    """(nnx, optax), or a one-line error that says how to install them."""
    try:
        import optax
        from flax import nnx
    except ImportError as error:
        raise DemoSetupError(
            f"the demo trains a Flax NNX model with optax and needs both ({error}); install them "
            "with: python -m pip install \".[demo]\"  (from a checkout) or "
            "python -m pip install flax optax"
        ) from None
    return nnx, optax


class DemoSetupError(RuntimeError):
    """A demo setting that cannot run here; main prints it as a one-line error."""


def make_attention_fn(cfg: DemoConfig) -> Callable:
    """The ``attention_fn`` for ``nnx.MultiHeadAttention``: causal, with the implementation cfg names."""
    if cfg.attention == "jax_dash":
        import jax_dash.flax

        return jax_dash.flax.make_attention_fn(is_causal=True, schedule=cfg.schedule)
    if cfg.attention == "cudnn" and jax.default_backend() != "gpu":
        raise DemoSetupError(
            f"--attention cudnn needs an NVIDIA GPU, but JAX runs on {jax.default_backend()!r}; "
            "use --attention jax_dash or --attention xla here"
        )

    def attention_fn(query, key, value, mask=None, dtype=None, **unused):
        # nnx.MultiHeadAttention calls with no mask here and no dropout (rate 0).
        del unused
        if mask is not None:
            raise ValueError("the demo's attention_fn takes no mask (it is causal)")
        if dtype is not None:
            query, key, value = (x.astype(dtype) for x in (query, key, value))
        return jax.nn.dot_product_attention(query, key, value, is_causal=True,
                                            implementation=cfg.attention)

    return attention_fn


def build_model(cfg: DemoConfig, vocab_size: int):
    """The Flax NNX model, its parameters initialised from ``cfg.seed``."""
    nnx, _ = _flax_modules()
    compute = jnp.dtype(cfg.dtype)
    d = cfg.d_model
    attention_fn = make_attention_fn(cfg)
    init = nnx.initializers.normal(_INIT_STD)

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.ln1 = nnx.LayerNorm(d, epsilon=_LAYERNORM_EPS, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(
                num_heads=cfg.heads, in_features=d, qkv_features=d, out_features=d,
                dtype=compute, param_dtype=jnp.float32, kernel_init=init, use_bias=False,
                attention_fn=attention_fn, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, epsilon=_LAYERNORM_EPS, rngs=rngs)
            self.mlp_in = nnx.Linear(d, _MLP_RATIO * d, dtype=compute, kernel_init=init,
                                     rngs=rngs)
            self.mlp_out = nnx.Linear(_MLP_RATIO * d, d, dtype=compute, kernel_init=init,
                                      rngs=rngs)

        def __call__(self, x):
            x = x + self.attn(self.ln1(x), deterministic=True).astype(jnp.float32)
            h = jax.nn.gelu(self.mlp_in(self.ln2(x)))
            return x + self.mlp_out(h).astype(jnp.float32)

    from jax_dash.flax import Embed

    class CharTransformer(nnx.Module):
        def __init__(self, rngs):
            self.embed = Embed(vocab_size, d, dtype=compute, param_dtype=jnp.float32,
                               embedding_init=init, rngs=rngs)
            self.pos = nnx.Param(init(rngs.params(), (cfg.seq, d), jnp.float32))
            self.blocks = nnx.Sequential(*(Block(rngs) for _ in range(cfg.layers)))
            self.ln_f = nnx.LayerNorm(d, epsilon=_LAYERNORM_EPS, rngs=rngs)

        def __call__(self, tokens):
            """Logits [batch, seq, vocab] (float32) for int32 tokens [batch, seq]."""
            # jax_dash.flax.Embed: a gather whose gradient sums in a fixed order.
            x = self.embed(tokens).astype(jnp.float32)
            x = self.blocks(x + self.pos[: tokens.shape[1]])
            x = self.ln_f(x).astype(compute)
            table = self.embed.embedding[...].astype(compute)  # tied: the output projection
            return jnp.einsum("bsd,vd->bsv", x, table, preferred_element_type=jnp.float32)

    return CharTransformer(nnx.Rngs(cfg.seed))


def make_optimizer(cfg: DemoConfig):
    """AdamW with global-norm clipping and a warm-up, the usual small-transformer recipe."""
    _, optax = _flax_modules()
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, _LEARNING_RATE, _WARMUP_STEPS, max(cfg.steps, _WARMUP_STEPS + 1),
        end_value=_LEARNING_RATE / 10)
    return optax.chain(optax.clip_by_global_norm(_CLIP_NORM),
                       optax.adamw(schedule, b1=_ADAM_B1, b2=_ADAM_B2, eps=_ADAM_EPS,
                                   weight_decay=_WEIGHT_DECAY))


class Trainer:
    """NNX's functional API: split the model into a static graph and a parameter pytree, then
    ``jax.jit`` one pure training step over (params, optimizer state, batch)."""

    def __init__(self, cfg: DemoConfig, vocab_size: int):
        nnx, optax = _flax_modules()
        self.cfg, self.vocab_size = cfg, vocab_size
        self.tx = make_optimizer(cfg)
        graphdef, _, rest = nnx.split(build_model(cfg, vocab_size), nnx.Param, ...)

        def loss_fn(params, inputs, targets):
            logits = nnx.merge(graphdef, params, rest)(inputs)
            # Integer labels: the gradient of their take_along_axis puts one value per row, so
            # no two updates meet and XLA's scatter is reproducible (check_determinism agrees).
            return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

        def train_step(params, opt_state, inputs, targets):
            loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self._train_step = jax.jit(train_step)
        self.step = None
        self.window = None

    def init(self):
        """Fresh parameters (from cfg.seed) and optimizer state."""
        nnx, _ = _flax_modules()
        params = nnx.state(build_model(self.cfg, self.vocab_size), nnx.Param)
        return params, self.tx.init(params)

    def compile(self, batch: np.ndarray):
        """Compiles the step once, before any clock starts: every run executes this program."""
        params, opt_state = self.init()
        window = jnp.asarray(batch)
        self.window = window
        self.step = self._train_step.lower(params, opt_state, window[:, :-1],
                                           window[:, 1:]).compile()
        return self

    def check_determinism(self):
        """``jax_dash.check_determinism`` of the training step: the GPU program (from its
        lowering, so also on a machine without a GPU) and two runs on this machine."""
        import jax_dash
        params, opt_state = self.init()
        args = (params, opt_state, self.window[:, :-1], self.window[:, 1:])
        gpu = jax_dash.check_determinism(self._train_step, *args, platform="gpu", runs=0)
        here = jax_dash.check_determinism(self._train_step, *args, runs=2)
        return gpu, here


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


def train_once(trainer: Trainer, batches: np.ndarray, label: str,
               progress: TextIO | None) -> RunResult:
    cfg = trainer.cfg
    params, opt_state = trainer.init()
    bar = _Progress(label, cfg.steps, progress, every=max(1, cfg.steps // 10))
    losses = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        window = jnp.asarray(batches[step])
        params, opt_state, loss = trainer.step(params, opt_state, window[:, :-1], window[:, 1:])
        losses.append(float(loss))  # also paces the loop, so the bar shows real progress
        bar.update(step + 1, losses[-1])
    params = jax.block_until_ready(params)
    return RunResult(losses, params_digest(params), time.perf_counter() - start, params)


def prepare(cfg: DemoConfig) -> tuple[Trainer, np.ndarray]:
    """The compiled trainer and the batches. Raises ValueError/DemoSetupError for settings the
    chosen attention cannot run (e.g. a head_dim the kernels do not take) before any training."""
    text = load_corpus()
    vocab = sorted(set(text))
    if cfg.vocab is not None and cfg.vocab < len(vocab):
        raise ValueError(f"vocab={cfg.vocab} must be at least the corpus's {len(vocab)} "
                         "characters")
    index = {ch: i for i, ch in enumerate(vocab)}
    tokens = np.array([index[ch] for ch in text], dtype=np.int32)
    batches = make_batches(tokens, cfg)
    return Trainer(cfg, cfg.vocab or len(vocab)).compile(batches[0]), batches


def run_demo(cfg: DemoConfig, progress: TextIO | None = None, runs: int = 2,
             prepared: tuple[Trainer, np.ndarray] | None = None) -> DemoResult:
    """Train ``runs`` times with identical inputs; the result holds losses and parameter hashes."""
    trainer, batches = prepared or prepare(cfg)
    results = [train_once(trainer, batches, f"run {i + 1}/{runs}", progress)
               for i in range(runs)]
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


class _Parser(argparse.ArgumentParser):
    """Errors as one line (no usage block): bad settings are common, the usage is in --help."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m jax_dash.demo",
        description="Train a small Flax NNX transformer (jax_dash attention, optax AdamW) twice "
                    "and check that the two runs end with bit-identical parameters. On a GPU it "
                    "then trains twice with cuDNN's attention for contrast. Defaults depend on "
                    "the backend: a float32 model that trains in well under a minute on a CPU, a "
                    "bf16 model at seq 1024 on a GPU.",
    )
    parser.add_argument("--attention", choices=ATTENTION_CHOICES, default="jax_dash",
                        help="attention implementation (cudnn and xla: jax.nn.dot_product_attention;"
                             " cudnn needs a GPU)")
    parser.add_argument("--no-contrast", action="store_true",
                        help="on a GPU, skip the two cuDNN runs that follow the jax_dash runs")
    parser.add_argument("--steps", type=int, help="training steps per run")
    parser.add_argument("--seq", type=int, help="sequence length (characters)")
    parser.add_argument("--layers", type=int, help="transformer layers")
    parser.add_argument("--heads", type=int, help="attention heads")
    parser.add_argument("--head-dim", type=int,
                        help="head dimension (a multiple of 8 up to 256)")
    parser.add_argument("--batch", type=int, help="sequences per step")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES,
                        help="compute dtype (GPU kernels: bfloat16 or float16)")
    parser.add_argument("--schedule", choices=SCHEDULE_CHOICES, default="auto",
                        help="jax_dash backward schedule ('atomic' is the non-reproducible baseline)")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and batch order")
    parser.add_argument("--no-check", action="store_true",
                        help="skip check_determinism of the training step before training")
    parser.add_argument("--vocab", type=int, default=None,
                        help="embedding rows (default: the corpus's characters), e.g. 128256 to "
                             "see a real vocabulary's cost")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _gpu_hardware_visible() -> bool:
    """An NVIDIA GPU's device node exists (Linux), whatever JAX can use."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def describe_device() -> str:
    """Where the demo runs, and on a CPU with an NVIDIA GPU present, how to get a CUDA JAX."""
    device = jax.devices()[0]
    line = f"device: {device.device_kind} ({jax.default_backend()}, {device})"
    if jax.default_backend() == "cpu" and _gpu_hardware_visible():
        line += ("\nnote: an NVIDIA GPU is present but this JAX has no CUDA support, so the demo "
                 "runs on the CPU. For the GPU: python -m pip install \"jax[cuda13]>=0.10,<0.13\" "
                 "(or jax[cuda12] for a CUDA 12 driver), then reinstall jax_dash with nvcc on PATH")
    return line


def _report_determinism_check(trainer: Trainer, out: TextIO) -> None:
    """What jax_dash.check_determinism finds in the training step, before it trains."""
    try:
        gpu, here = trainer.check_determinism()
    except ValueError as error:  # a backend it does not know (it names the platforms it does)
        out.write(f"check_determinism(train_step): not run: {error}\n")
        return
    out.write("check_determinism(train_step): ")
    if gpu.findings:
        out.write(f"{len(gpu.findings)} operation(s) not reproducible on a GPU:\n")
        for finding in gpu.findings:
            out.write(f"  {finding}\n")
    else:
        out.write("no operation that is not reproducible on a GPU; ")
    out.write(f"the step run twice on {here.platform}: "
              + ("bitwise identical" if here.identical else "DIFFERENT") + "\n")
    out.flush()


def _run_pair(cfg: DemoConfig, args, out: TextIO, progress: TextIO | None,
              parser: argparse.ArgumentParser) -> DemoResult:
    out.write(
        f"Flax NNX char-level decoder, {cfg.layers} layers, {cfg.heads} heads x {cfg.head_dim}, "
        f"seq {cfg.seq}, batch {cfg.batch}, {cfg.steps} steps, {cfg.dtype}, optax AdamW, "
        + (f"vocabulary {cfg.vocab}, " if cfg.vocab else "")
        + f"attention {cfg.attention}"
        + (f" (schedule {cfg.schedule})" if cfg.attention == "jax_dash" else "")
        + f", seed {cfg.seed}\n"
    )
    out.flush()
    try:
        prepared = prepare(cfg)
    except (DemoSetupError, ValueError, TypeError) as error:
        # Settings the chosen attention cannot run (say --head-dim 20): one line, no traceback.
        parser.error(str(error).splitlines()[0])
    if not args.no_check:
        _report_determinism_check(prepared[0], out)
    result = run_demo(cfg, progress=None if args.quiet else progress, prepared=prepared)
    report(result, out)
    return result


def main(argv: list[str] | None = None, out: TextIO | None = None,
         progress: TextIO | None = None) -> int:
    """Runs the demo; returns 0, or 1 when jax_dash's reproducible runs differ (a bug)."""
    parser = _parser()
    args = parser.parse_args(argv)
    out = out or sys.stdout
    progress = progress or sys.stderr
    try:
        cfg = default_config(
            steps=args.steps, seq=args.seq, layers=args.layers, heads=args.heads,
            head_dim=args.head_dim, batch=args.batch, dtype=args.dtype,
            attention=args.attention, schedule=args.schedule, seed=args.seed, vocab=args.vocab,
        )
    except ValueError as error:
        parser.error(str(error))
    if cfg.schedule != "auto" and cfg.attention != "jax_dash":
        parser.error(f"--schedule {cfg.schedule} applies to --attention jax_dash only")
    on_gpu = jax.default_backend() == "gpu"
    if cfg.attention == "cudnn" and not on_gpu:
        parser.error(f"--attention cudnn needs an NVIDIA GPU, but JAX runs on "
                     f"{jax.default_backend()!r} here; use --attention jax_dash or xla")
    out.write(f"jax_dash demo, {describe_device()}\n")
    result = _run_pair(cfg, args, out, progress, parser)
    reproducible_by_design = cfg.attention == "jax_dash" and cfg.schedule != "atomic"
    code = 1 if (reproducible_by_design and not result.identical) else 0
    if cfg.attention != "jax_dash" or args.no_contrast:
        return code
    if on_gpu:
        out.write(f"\ncontrast: the same training with jax.nn.dot_product_attention("
                  f"implementation={CONTRAST_ATTENTION!r}), whose backward adds with atomics:\n")
        _run_pair(dataclasses.replace(cfg, attention=CONTRAST_ATTENTION, schedule="auto"), args,
                  out, progress, parser)
    else:
        out.write("note: on a CPU, XLA's own attention is reproducible too (no atomics), so the "
                  "contrast with a racing backward (cuDNN's) needs an NVIDIA GPU.\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
