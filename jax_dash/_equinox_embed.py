"""``jax_dash.equinox.Embedding``: ``equinox.nn.Embedding`` whose gradient is reproducible."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from jax_dash.embedding import embed


class Embedding(eqx.nn.Embedding):
    """A drop-in for ``equinox.nn.Embedding`` (same fields, constructor and initialization): the
    lookup is ``jax_dash.embed``, so the table's gradient is summed in a fixed order (bitwise
    reproducible on a GPU).

    Differences: it also takes an integer array of ids (``embedding(ids)`` -> ``ids.shape +
    (embedding_size,)``), which is the way to use it in a model: under ``jax.grad``, a
    ``jax.vmap(embedding)(ids)`` builds one table-sized gradient per id before JAX sums them (a
    custom gradient cannot fold JAX's sum over the mapped axis), where one call on the array sums
    every id into one gradient. An out-of-range index gives a NaN row (``jnp.take``'s rule) where
    ``weight[x]`` clamps it."""

    def __call__(self, x, *, key=None):
        del key  # as in equinox: accepted for API compatibility, unused
        if eqx.is_array_like(x) and jnp.issubdtype(jnp.result_type(x), jnp.integer):
            return embed(self.weight, x)
        raise ValueError("`jax_dash.equinox.Embedding()(x)` takes an integer index or an integer "
                         f"array of indices, got {x!r:.80}")
