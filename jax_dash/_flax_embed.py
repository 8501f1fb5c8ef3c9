"""``jax_dash.flax.Embed``: ``flax.nnx.Embed`` whose gradient is reproducible (imports Flax, so
``jax_dash.flax`` loads it only when ``Embed`` is asked for)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_dash.embedding import embed


class Embed(nnx.Embed):
    """A drop-in for ``flax.nnx.Embed``: the same constructor, parameter (``embedding``),
    initialization, dtypes and ``attend``; the lookup is ``jax_dash.embed``, so the gradient with
    respect to the table is summed in a fixed order (bitwise reproducible on a GPU), where
    ``nnx.Embed``'s gather gradient is a racing scatter-add."""

    def __call__(self, inputs, out_sharding=None):
        inputs = jnp.asarray(inputs)
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError("Input type must be an integer or unsigned integer "
                             f"(jax_dash.flax.Embed got {inputs.dtype.name}).")
        (table,) = self.promote_dtype((self.embedding[...],), dtype=self.dtype, inexact=False)
        if self.num_embeddings == 1:  # as nnx.Embed: one row serves every id
            return jnp.broadcast_to(table, inputs.shape + (self.features,))
        if out_sharding is not None:
            return jax.sharding.auto_axes(embed, out_sharding=out_sharding)(table, inputs)
        return embed(table, inputs)
