"""jax_dash: attention for JAX whose backward pass is bitwise reproducible (DASH schedules)."""

from jax_dash import ring
from jax_dash._version import BITS_VERSION, __version__
from jax_dash.attention import SCHEDULES, attention
from jax_dash.determinism import DeterminismReport, Finding, check_determinism
from jax_dash.dropout import dropout_keep_mask
from jax_dash.embedding import embed, segment_sum
from jax_dash.ring import ring_attention

__all__ = ["attention", "ring_attention", "ring", "SCHEDULES", "embed", "segment_sum",
           "check_determinism", "DeterminismReport", "Finding", "dropout_keep_mask",
           "BITS_VERSION", "__version__"]
