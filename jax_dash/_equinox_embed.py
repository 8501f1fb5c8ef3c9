"""``jax_dash.equinox.Embedding``: ``equinox.nn.Embedding`` whose gradient is reproducible."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from jax_dash.embedding import embed


class Embedding(eqx.nn.Embedding):
    """A drop-in for ``equinox.nn.Embedding`` (same fields, constructor and initialization): the
    lookup is ``jax_dash.embed``, so under ``jax.vmap`` over token ids the table's gradient is
    summed in a fixed order (bitwise reproducible on a GPU). One difference: an out-of-range index
    gives a NaN row (``jnp.take``'s rule) where ``weight[x]`` clamps it."""

    def __call__(self, x, *, key=None):
        del key  # as in equinox: accepted for API compatibility, unused
        if eqx.is_array_like(x) and jnp.shape(x) == ():
            return embed(self.weight, x)
        raise ValueError("`jax_dash.equinox.Embedding()(x)` should be called with a scalar index "
                         "`x`. Use `jax.vmap` if you would like to index with multiple values.")
