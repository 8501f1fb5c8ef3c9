"""The benchmark grid: points, FLOP counts and option parsing shared by all benchmark parts."""

from __future__ import annotations

import dataclasses

# DASH paper grid (arXiv 2601.21824): a fixed token budget and hidden size, so heads and batch
# follow from head_dim and seq.
PAPER_TOKENS = 16384
PAPER_HIDDEN = 2048
PAPER_HEAD_DIMS = (64, 128)
PAPER_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
MASKS = ("full", "causal")

# Backward FLOPs relative to forward: 5 matmuls against the forward's 2 (FlashAttention convention).
BWD_FLOP_FACTOR = 2.5

IMPLS = ("jax_dash", "cudnn", "cudnn_det", "xla", "fa3", "fa3_det", "tokamax", "triton_tutorial")
DTYPES = ("bfloat16", "float16")
DEFAULT_DTYPE = "bfloat16"
# jax_dash.SCHEDULES, spelled out because the harness also runs (peers only) where jax_dash is not
# importable, and its parent process imports no jax; tests/test_benchmarks.py checks the two agree.
SCHEDULES = ("auto", "ascending", "descending", "shift", "symmetric_shift", "atomic", "mirror")
DETERMINISTIC_SCHEDULES = tuple(s for s in SCHEDULES if s != "atomic")


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point: tensors are [batch, seq, heads, head_dim], self-attention (seq_q == seq_kv)."""

    head_dim: int
    seq: int
    mask: str
    batch: int
    heads: int
    kv_heads: int | None = None  # GQA: None means heads (multi-head attention)
    dtype: str = DEFAULT_DTYPE  # of q, k, v and dout

    def __post_init__(self):
        for name in ("head_dim", "seq", "batch", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Point.{name}={value!r} must be a positive int")
        if self.mask not in MASKS:
            raise ValueError(f"Point.mask={self.mask!r} must be one of {MASKS}")
        if self.kv_heads is not None and (not isinstance(self.kv_heads, int) or self.kv_heads <= 0
                                          or self.heads % self.kv_heads):
            raise ValueError(f"Point.kv_heads={self.kv_heads!r} must be a positive int dividing "
                             f"heads={self.heads}")
        if self.dtype not in DTYPES:
            raise ValueError(f"Point.dtype={self.dtype!r} must be one of {DTYPES}")

    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def is_causal(self) -> bool:
        return self.mask == "causal"

    @property
    def key(self) -> str:
        gqa = "" if self.num_kv_heads == self.heads else f"-kv{self.kv_heads}"
        # bf16 points keep the keys they had before the dtype was a field.
        dtype = "" if self.dtype == DEFAULT_DTYPE else f"-{self.dtype}"
        return f"hd{self.head_dim}-{self.mask}-s{self.seq}-b{self.batch}-h{self.heads}{gqa}{dtype}"

    def label(self) -> str:
        gqa = "" if self.num_kv_heads == self.heads else f" KV={self.kv_heads}"
        dtype = "" if self.dtype == DEFAULT_DTYPE else f" {self.dtype}"
        return (f"hd={self.head_dim} {self.mask} seq={self.seq} B={self.batch} "
                f"H={self.heads}{gqa}{dtype}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Point":
        return Point(**{f.name: d[f.name] for f in dataclasses.fields(Point) if f.name in d})


def forward_flops(p: Point) -> float:
    """4*B*H*Sq*Sk*D (two matmuls), halved for the causal mask."""
    flops = 4.0 * p.batch * p.heads * p.seq * p.seq * p.head_dim
    return flops / 2 if p.is_causal else flops


def backward_flops(p: Point) -> float:
    return BWD_FLOP_FACTOR * forward_flops(p)


def tflops(p: Point, timed: dict) -> dict:
    """TFLOP/s of a time item's result (its "fwd", "bwd" and "fwd_bwd" median seconds)."""
    fwd, bwd = forward_flops(p), backward_flops(p)
    return {"fwd": fwd / timed["fwd"]["median_s"] / 1e12,
            "bwd": bwd / timed["bwd"]["median_s"] / 1e12,
            "fwd_bwd": (fwd + bwd) / timed["fwd_bwd"]["median_s"] / 1e12}


def make_grid(head_dims, seqs, masks, *, tokens=PAPER_TOKENS, hidden=PAPER_HIDDEN,
              group: int = 1, dtype: str = DEFAULT_DTYPE) -> list[Point]:
    """Paper grid: batch = tokens // seq, heads = hidden // head_dim; ordered hd, mask, seq.
    `group` > 1 makes GQA points: heads // group KV heads."""
    points = []
    for head_dim in head_dims:
        if hidden % head_dim:
            raise ValueError(f"head_dim={head_dim} must divide hidden={hidden}")
        for mask in masks:
            for seq in seqs:
                if tokens % seq:
                    raise ValueError(
                        f"seq={seq} must divide tokens={tokens} (batch = tokens // seq); "
                        f"pass --tokens with a multiple of every --seqs value")
                heads = hidden // head_dim
                if heads % group:
                    raise ValueError(f"group={group} must divide heads={heads} (hidden // head_dim "
                                     f"at head_dim={head_dim})")
                points.append(Point(head_dim=head_dim, seq=seq, mask=mask, batch=tokens // seq,
                                    heads=heads, kv_heads=None if group == 1 else heads // group,
                                    dtype=dtype))
    return points


def parse_int_list(text: str, *, name: str) -> tuple[int, ...]:
    """'512,1k,16k' -> (512, 1024, 16384); errors name the option."""
    values = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        scale = 1
        if item.endswith("k"):
            item, scale = item[:-1], 1024
        try:
            value = int(item) * scale
        except ValueError:
            raise ValueError(f"{name}={text!r}: {item!r} is not an integer (use e.g. 512,1k,16k)")
        if value <= 0:
            raise ValueError(f"{name}={text!r}: values must be positive, got {value}")
        values.append(value)
    if not values:
        raise ValueError(f"{name}={text!r} is empty")
    return tuple(values)


def parse_choice_list(text: str, *, name: str, allowed) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ValueError(f"{name}={text!r}: {bad or 'empty'} not allowed; choose from {tuple(allowed)}")
    return values
