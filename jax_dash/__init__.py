"""jax_dash: attention for JAX whose backward pass is bitwise reproducible (DASH schedules)."""

from jax_dash.attention import SCHEDULES, attention

__all__ = ["attention", "SCHEDULES"]
__version__ = "0.1.0"
