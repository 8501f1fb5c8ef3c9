"""The public op on a Hopper GPU: forward + backward through jax.vjp under jit, grad, vmap,
shard_map and GSPMD sharding, against the fp32 reference, and bitwise against the plain call.

The CPU versions of these tests (tests/test_transforms.py) run on 8 virtual CPU devices; these run
the CUDA FFI handlers. Skipped unless an sm_90 GPU is present.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_dash
from helpers import (GPU_MARKS, assert_close_to_reference, attention_and_grads, hopper_devices,
                     random_inputs, references)
from jax_dash.reference import reference_forward

try:
    from jax import shard_map as _shard_map
except ImportError:  # older jax spells it jax.experimental.shard_map
    from jax.experimental.shard_map import shard_map as _shard_map


HOPPER = hopper_devices()
pytestmark = GPU_MARKS

SHAPE = (2, 300, 300, 4, 2, 128)  # batch, seq_q, seq_kv, heads, kv_heads, head_dim: GQA, partial tiles


@pytest.fixture(scope="module")
def inputs():
    q, k, v, dout = random_inputs(21, *SHAPE, jnp.bfloat16)
    return tuple(jax.device_put(x, HOPPER[0]) for x in (q, k, v, dout))


def _bits(x):
    return np.asarray(x).view(np.uint16)


def _assert_bitwise(a, b, what):
    for name, x, y in zip(("out", "dq", "dk", "dv"), a, b):
        assert x.shape == y.shape, (what, name, x.shape, y.shape)
        assert np.array_equal(_bits(x), _bits(y)), f"{what}: {name} differs bitwise"


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_jit_vjp_matches_reference_and_runs_on_the_gpu(inputs, is_causal):
    q, k, v, dout = inputs
    fn = jax.jit(lambda q, k, v, dout: attention_and_grads(
        lambda q, k, v: jax_dash.attention(q, k, v, is_causal=is_causal), q, k, v, dout))
    ours = fn(q, k, v, dout)
    assert "jax_dash_bwd" in fn.lower(q, k, v, dout).as_text()
    for x in ours:
        assert x.devices() == {HOPPER[0]}
    ref, naive = jax.jit(lambda q, k, v, dout: references(q, k, v, dout, is_causal=is_causal))(
        q, k, v, dout)
    for name, x, r, nv in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
        atol = 4e-3 * float(jnp.max(jnp.abs(r))) + 1e-5
        assert_close_to_reference(f"causal={is_causal} {name}", x, r, nv, atol)


def test_grad_of_a_scalar_loss(inputs):
    q, k, v, _ = inputs

    def loss(q, k, v):
        return jnp.sum(jax_dash.attention(q, k, v, is_causal=True).astype(jnp.float32) ** 2)

    def ref_loss(q, k, v):
        out, _ = reference_forward(q, k, v, is_causal=True)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    ref = jax.jit(jax.grad(ref_loss, argnums=(0, 1, 2)))(*f32)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        assert g.dtype == q.dtype
        rel = float(jnp.max(jnp.abs(g.astype(jnp.float32) - r))) / float(jnp.max(jnp.abs(r)))
        assert rel < 3e-2, (name, rel)


def test_vmap_is_bitwise_the_per_sequence_call(inputs):
    q, k, v, dout = inputs
    # An extra leading axis of 2 over [batch, seq, heads, dim] inputs: vmap folds it into batch.
    stack = [jnp.stack([x, x[::-1]]) for x in (q, k, v, dout)]

    def one(q, k, v, dout):
        return attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                                   q, k, v, dout)

    batched = jax.jit(jax.vmap(one))(*stack)
    for i in range(2):
        single = jax.jit(one)(*(x[i] for x in stack))
        _assert_bitwise([x[i] for x in batched], single, f"vmap element {i}")


def test_shard_map_and_gspmd_on_the_gpu_mesh(inputs):
    q, k, v, dout = inputs
    # The batch of 2 splits over at most two GPUs; the inputs live on the first one, so they are
    # placed on the mesh first (with two GPUs, jit refuses arguments committed to one device).
    mesh = Mesh(np.array(HOPPER[:2]), ("data",))
    spec = P("data")

    def fwd_bwd(q, k, v, dout):
        return attention_and_grads(lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True),
                                   q, k, v, dout)

    plain = jax.jit(fwd_bwd)(q, k, v, dout)
    sharded = [jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v, dout)]
    mapped = jax.jit(_shard_map(fwd_bwd, mesh=mesh, in_specs=(spec,) * 4,
                                out_specs=(spec,) * 4))(*sharded)
    _assert_bitwise(mapped, plain, "shard_map")
    gspmd = jax.jit(fwd_bwd)(*sharded)
    _assert_bitwise(gspmd, plain, "GSPMD")


@pytest.mark.parametrize("schedule", ["auto", "ascending", "descending", "shift",
                                      "symmetric_shift"])
def test_every_schedule_is_repeatable_through_the_public_op(inputs, schedule):
    q, k, v, dout = inputs
    fn = jax.jit(lambda q, k, v, dout: attention_and_grads(
        lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True, schedule=schedule),
        q, k, v, dout))
    first = fn(q, k, v, dout)
    for _ in range(5):
        _assert_bitwise(fn(q, k, v, dout), first, schedule)


def test_traced_scale_gives_the_bits_of_a_python_scale(inputs):
    """The kernels read the scale from device memory: a traced scale (one executable for every
    value) gives the bits of the same Python number, and each value its own result."""
    q, k, v, dout = inputs

    def fwd_bwd(scale):
        return attention_and_grads(
            lambda q, k, v: jax_dash.attention(q, k, v, scale=scale, is_causal=True),
            q, k, v, dout)

    traced = jax.jit(fwd_bwd)
    for value in (0.07, -0.3):
        for a, b in zip(traced(jnp.float32(value)), fwd_bwd(value)):
            np.testing.assert_array_equal(_bits(a), _bits(b))
    assert traced._cache_size() == 1
    assert not np.array_equal(_bits(traced(jnp.float32(0.07))[0]),
                              _bits(traced(jnp.float32(-0.3))[0]))


def test_gpu_scan_of_layers_runs_the_forward_once_per_layer():
    """The gradient of layers under lax.scan holds one forward call: XLA's GPU pass
    dynamic-slice-fusion-rewriter-v2 copied the call into the stores of the residuals (here the
    output projection's input), so the forward kernel ran twice a layer in training steps."""
    import re

    def layer(x, w):
        q = (x @ w).reshape(x.shape[0], x.shape[1], 4, 64)
        o = jax_dash.attention(q, q[:, :, :2], q[:, :, :2], is_causal=True)
        # The output projection keeps its input, the attention output, for the backward: the
        # residual store that the pass fused with a copy of the forward call.
        return x + o.reshape(x.shape) @ w, None

    def loss(x, ws):
        y, _ = jax.lax.scan(layer, x, ws)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    device = HOPPER[0]
    x = jax.device_put(jnp.ones((2, 256, 256), jnp.bfloat16), device)
    ws = jax.device_put(jnp.full((3, 256, 256), 0.01, jnp.bfloat16), device)
    hlo = jax.jit(jax.grad(loss, argnums=1)).lower(x, ws).compile().as_text()
    forward_sites = re.findall(r'custom_call_target="jax_dash_fwd', hlo)
    backward_sites = re.findall(r'custom_call_target="jax_dash_bwd', hlo)
    assert len(forward_sites) == 1, f"{len(forward_sites)} forward call sites in the compiled HLO"
    assert len(backward_sites) == 1
