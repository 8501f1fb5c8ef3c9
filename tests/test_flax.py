"""jax_dash.flax: the attention_fn adapter for flax.nnx and flax.linen multi-head attention."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
optax = pytest.importorskip("optax")
from flax import nnx  # noqa: E402
import flax.linen as nn  # noqa: E402

import jax_dash  # noqa: E402
import jax_dash.flax as jdf  # noqa: E402

BATCH, SEQ, FEATURES, HEADS, VOCAB = 2, 24, 32, 4, 11
TRAIN_STEPS = 3
# Attention differs from XLA's by float32 rounding; three Adam steps keep that near 1e-6.
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-4


pytestmark = pytest.mark.usefixtures("on_cpu")  # float32 CPU tests (conftest.py)


def _tokens(seed=0):
    return jax.random.randint(jax.random.key(seed), (BATCH, SEQ + 1), 0, VOCAB)


def test_signature_covers_flax_attention_fn_parameters():
    # Linen passes only the keywords an attention_fn declares: a missing name would be dropped
    # silently, so every name Flax may pass must be declared (and then honoured or rejected).
    ours = set(inspect.signature(jdf.attention_fn).parameters)
    for flax_fn in (nnx.dot_product_attention, nn.dot_product_attention):
        missing = set(inspect.signature(flax_fn).parameters) - ours
        assert not missing, f"{flax_fn.__module__}: {missing}"


# ---------------------------------------------------------------------------------------------
# NNX: a tiny causal language model trained three steps, against Flax's own attention.


class NnxModel(nnx.Module):
    def __init__(self, attention_fn, *, rngs):
        self.embed = nnx.Embed(VOCAB, FEATURES, rngs=rngs)
        # No qkv biases: the key bias has an exactly-zero gradient (softmax ignores it), and Adam
        # would blow its rounding noise up to full-size steps that differ between kernels.
        self.attn = nnx.MultiHeadAttention(HEADS, FEATURES, decode=False, use_bias=False,
                                           attention_fn=attention_fn, rngs=rngs)
        self.head = nnx.Linear(FEATURES, VOCAB, rngs=rngs)

    def __call__(self, tokens, how):
        x = self.embed(tokens)
        if how == "is_causal":
            x = x + self.attn(x, is_causal=True)
        else:  # a dense causal mask, as many Flax models build it
            x = x + self.attn(x, mask=nnx.make_causal_mask(tokens))
        return self.head(x)


def _train_nnx(attention_fn, how):
    model = NnxModel(attention_fn, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, tokens):
        def loss_fn(model):
            logits = model(tokens[:, :-1], how)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    tokens = _tokens()  # one batch throughout, so the loss must fall
    losses = [float(step(model, optimizer, tokens)) for _ in range(TRAIN_STEPS)]
    return losses, nnx.state(model, nnx.Param)


def _assert_same_training(ours, ref):
    (ours_losses, ours_params), (ref_losses, ref_params) = ours, ref
    np.testing.assert_allclose(ours_losses, ref_losses, rtol=LOSS_RTOL)
    assert ours_losses[-1] < ours_losses[0]
    ours_leaves, ref_leaves = jax.tree.leaves(ours_params), jax.tree.leaves(ref_params)
    assert len(ours_leaves) == len(ref_leaves) > 0
    for a, b in zip(ours_leaves, ref_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=PARAM_ATOL)


@pytest.mark.parametrize(
    "attention_fn, how",
    [
        (jdf.attention_fn, "is_causal"),  # pattern from the call's is_causal
        (jdf.make_attention_fn(is_causal=True), "is_causal"),
        (jdf.make_attention_fn(is_causal=True), "mask"),  # traced mask, verified at run time
    ],
    ids=["call-is_causal", "declared", "declared+mask"],
)
def test_nnx_model_trains_like_flax_attention(attention_fn, how):
    reference = _train_nnx(nnx.dot_product_attention, how)
    _assert_same_training(_train_nnx(attention_fn, how), reference)


# ---------------------------------------------------------------------------------------------
# Linen: same, with the dense causal mask Linen models use.


class LinenModel(nn.Module):
    attention_fn: object

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(VOCAB, FEATURES)(tokens)
        x = x + nn.MultiHeadDotProductAttention(HEADS, use_bias=False,  # see NnxModel
                                            attention_fn=self.attention_fn)(
            x, mask=nn.make_causal_mask(tokens))
        return nn.Dense(VOCAB)(x)


def _train_linen(attention_fn):
    model = LinenModel(attention_fn)
    params = model.init(jax.random.key(0), _tokens()[:, :-1])
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, tokens):
        def loss_fn(params):
            logits = model.apply(params, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    tokens = _tokens()  # one batch throughout, so the loss must fall
    for _ in range(TRAIN_STEPS):
        params, opt_state, loss = step(params, opt_state, tokens)
        losses.append(float(loss))
    return losses, params


def test_linen_model_trains_like_flax_attention():
    reference = _train_linen(nn.dot_product_attention)
    _assert_same_training(_train_linen(jdf.make_attention_fn(is_causal=True)), reference)


# ---------------------------------------------------------------------------------------------
# Direct calls: masks, batch dims, and everything that must be refused.


def _qkv(shape=(BATCH, SEQ, HEADS, 8), seed=1):
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(k, shape, jnp.float32) for k in keys)


def _causal(shape=(BATCH, SEQ, HEADS, 8)):
    return jax.nn.dot_product_attention(*_qkv(shape), is_causal=True)


def test_concrete_causal_mask_is_recognized():
    mask = nnx.make_causal_mask(jnp.ones((BATCH, SEQ)))
    np.testing.assert_allclose(jdf.attention_fn(*_qkv(), mask=mask), _causal(), atol=1e-5)


def test_concrete_all_true_mask_means_full_attention():
    mask = np.ones((BATCH, 1, SEQ, SEQ), bool)
    full = jax.nn.dot_product_attention(*_qkv())
    np.testing.assert_allclose(jdf.attention_fn(*_qkv(), mask=mask), full, atol=1e-5)


def test_concrete_other_mask_is_refused():
    padding = nnx.make_attention_mask(jnp.ones((BATCH, SEQ)), jnp.arange(SEQ)[None] < SEQ - 3)
    with pytest.raises(ValueError, match="neither the causal pattern"):
        jdf.attention_fn(*_qkv(), mask=padding)


def test_concrete_mask_contradicting_declaration_is_refused():
    with pytest.raises(ValueError, match="mask is all True but is_causal=True"):
        jdf.make_attention_fn(is_causal=True)(*_qkv(), mask=np.ones((SEQ, SEQ), bool))


def test_traced_mask_without_declaration_is_refused_while_tracing():
    fn = jax.jit(lambda q, k, v, m: jdf.attention_fn(q, k, v, mask=m))
    with pytest.raises(ValueError, match="traced array"):
        fn(*_qkv(), nnx.make_causal_mask(jnp.ones((BATCH, SEQ))))


def test_traced_causal_mask_passes_the_runtime_check():
    fn = jax.jit(lambda q, k, v, m: jdf.make_attention_fn(is_causal=True)(q, k, v, mask=m))
    out = fn(*_qkv(), nnx.make_causal_mask(jnp.ones((BATCH, SEQ))))
    np.testing.assert_allclose(out, _causal(), atol=1e-5)


def test_traced_wrong_mask_fails_at_run_time():
    fn = jax.jit(lambda q, k, v, m: jdf.make_attention_fn(is_causal=True)(q, k, v, mask=m))
    mask = np.tril(np.ones((SEQ, SEQ), bool))
    mask[5, 0] = False  # one entry off the causal pattern
    with pytest.raises(Exception, match="does not match the declared pattern"):
        jax.block_until_ready(fn(*_qkv(), mask[None, None]))


def test_traced_wrong_mask_fails_under_grad():
    def loss(q, k, v, m):
        return jdf.make_attention_fn(is_causal=False)(q, k, v, mask=m).sum()

    grad = jax.jit(jax.grad(loss))
    with pytest.raises(Exception, match="does not match the declared pattern"):
        jax.block_until_ready(grad(*_qkv(), np.tril(np.ones((SEQ, SEQ), bool))))


def test_check_mask_false_trusts_the_declaration():
    fn = jax.jit(lambda q, k, v, m: jdf.make_attention_fn(is_causal=True, check_mask=False)(
        q, k, v, mask=m))
    out = fn(*_qkv(), nnx.make_causal_mask(jnp.ones((BATCH, SEQ))))
    np.testing.assert_allclose(out, _causal(), atol=1e-5)


def test_mask_with_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="does not broadcast"):
        jdf.attention_fn(*_qkv(), mask=np.ones((SEQ + 1, SEQ + 1), bool))


def test_several_batch_dims_are_folded():
    shape = (2, 3, SEQ, HEADS, 8)
    q, k, v = _qkv(shape)
    out = jdf.attention_fn(q, k, v, is_causal=True)
    ref = jax.nn.dot_product_attention(*(x.reshape(6, SEQ, HEADS, 8) for x in (q, k, v)),
                                       is_causal=True).reshape(shape)
    assert out.shape == shape
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_dtype_argument_promotes_like_flax():
    out = jdf.attention_fn(*_qkv(), is_causal=True, dtype=jnp.bfloat16)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), _causal(), atol=5e-2)


def test_broadcast_dropout_in_training_is_refused():
    """Flax's default broadcast_dropout=True shares one mask over batch rows and heads, which
    jax_dash's dropout does not draw: refused, naming the way out."""
    with pytest.raises(ValueError, match="broadcast_dropout=True .*broadcast_dropout=False"):
        jdf.attention_fn(*_qkv(), dropout_rate=0.1, deterministic=False,
                         dropout_rng=jax.random.key(0))


def test_dropout_in_training_is_jax_dash_dropout():
    q, k, v = _qkv()
    rng = jax.random.key(3)
    out = jdf.attention_fn(q, k, v, is_causal=True, dropout_rate=0.2, deterministic=False,
                           broadcast_dropout=False, dropout_rng=rng)
    expected = jax_dash.attention(q, k, v, is_causal=True, dropout_rate=0.2, dropout_rng=rng)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    assert not np.allclose(np.asarray(out), _causal(), atol=1e-3)  # dropout did something


def test_dropout_inside_shard_map_with_dropout_axes():
    """make_attention_fn(dropout_axes=...) inside shard_map over batch and heads: the unsharded
    call's bits; without it the call asks for the argument."""
    from jax.sharding import Mesh, PartitionSpec as P
    q, k, v = _qkv()
    rng = jax.random.key(4)
    kwargs = dict(is_causal=True, dropout_rate=0.2, deterministic=False, broadcast_dropout=False,
                  dropout_rng=rng)
    mesh = Mesh(np.array(jax.devices("cpu")[:4]).reshape(2, 2), ("data", "model"))
    spec = P("data", None, "model")

    def sharded(attention_fn):
        return jax.jit(jax.shard_map(lambda q, k, v: attention_fn(q, k, v, **kwargs), mesh=mesh,
                                     in_specs=(spec,) * 3, out_specs=spec))(q, k, v)

    out = sharded(jdf.make_attention_fn(dropout_axes=("data", "model")))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jdf.attention_fn(q, k, v, **kwargs)))
    with pytest.raises(ValueError, match="inside shard_map needs the global coordinates"):
        sharded(jdf.attention_fn)
    with pytest.raises(TypeError, match="dropout_axes must be"):
        jdf.make_attention_fn(dropout_axes="data")


def test_dropout_in_evaluation_runs():
    out = jdf.attention_fn(*_qkv(), is_causal=True, dropout_rate=0.1, deterministic=True)
    np.testing.assert_allclose(out, _causal(), atol=1e-5)


def test_nnx_module_with_broadcast_dropout_training_is_refused():
    mha = nnx.MultiHeadAttention(HEADS, FEATURES, decode=False, dropout_rate=0.1,
                                 attention_fn=jdf.attention_fn, rngs=nnx.Rngs(0, dropout=1))
    x = jnp.ones((BATCH, SEQ, FEATURES))
    with pytest.raises(ValueError, match="broadcast_dropout=False"):
        mha(x, is_causal=True, deterministic=False)


def test_nnx_module_trains_with_dropout_reproducibly():
    """broadcast_dropout=False: the module's dropout is jax_dash's; the same dropout stream gives
    the same bits, gradients included."""
    x = jax.random.normal(jax.random.key(4), (BATCH, SEQ, FEATURES))

    def grads_of_fresh_module():
        mha = nnx.MultiHeadAttention(HEADS, FEATURES, decode=False, dropout_rate=0.1,
                                     broadcast_dropout=False, attention_fn=jdf.attention_fn,
                                     rngs=nnx.Rngs(0, dropout=1))

        def loss(m):
            return jnp.sum(m(x, is_causal=True, deterministic=False) ** 2)

        return jax.tree.leaves(nnx.grad(loss)(mha))

    first, second = grads_of_fresh_module(), grads_of_fresh_module()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kwargs, match", [
    (dict(bias=jnp.zeros((1, HEADS, SEQ, SEQ))), "bias"),
    (dict(module=object()), "sow_weights"),
    (dict(qk_attn_weights_einsum=jnp.einsum), "qk_attn_weights_einsum"),
])
def test_unsupported_features_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        jdf.attention_fn(*_qkv(), **kwargs)


def test_declaration_conflict_is_refused():
    with pytest.raises(ValueError, match="conflicts"):
        jdf.make_attention_fn(is_causal=False)(*_qkv(), is_causal=True)


def test_factory_arguments_are_validated():
    with pytest.raises(TypeError, match="is_causal='yes'"):
        jdf.make_attention_fn(is_causal="yes")
    with pytest.raises(ValueError, match="schedule='fast'"):
        jdf.make_attention_fn(schedule="fast")
    with pytest.raises(ValueError, match="scale must be finite, got 1e"):
        jdf.make_attention_fn(scale=1e39)
    with pytest.raises(TypeError, match="scale must be a real number or a 0-d array of a real "
                                        "dtype, got '0.5'"):
        jdf.make_attention_fn(scale="0.5")


@pytest.mark.parametrize("scale", [0.125, 3, np.float32(0.5), -1.0, 0.0, 1e39, -1e39, 10**400,
                                   float("inf"), float("nan"), "0.5", True, jnp.ones(())],
                         ids=lambda scale: repr(scale)[:24])
def test_factory_takes_exactly_the_scales_attention_takes(scale):
    def outcome(call):
        try:
            call()
        except (TypeError, ValueError) as error:
            return type(error), str(error)
        return None

    q, k, v = _qkv((1, 16, 2, 8))
    by_attention = outcome(lambda: jax_dash.attention(q, k, v, scale=scale))
    by_factory = outcome(lambda: jdf.make_attention_fn(scale=scale))
    assert by_factory == by_attention


def _doc_examples(marker):
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "flax_equinox.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    return [b for b in blocks if marker in b]


def test_flax_doc_examples_run():
    examples = _doc_examples("jax_dash.flax")
    assert len(examples) >= 3
    for code in examples:
        exec(compile(code, "docs/flax_equinox.md", "exec"), {})


def test_nnx_decoding_is_refused_while_tracing():
    # The KV-cache mask lets the new query see all cached keys: not causal (top-left), so
    # decoding is refused, by name, before anything runs (tests/test_dropin.py: every path).
    mha = nnx.MultiHeadAttention(2, 16, decode=True, rngs=nnx.Rngs(0),
                                 attention_fn=jdf.make_attention_fn(is_causal=True))
    mha.init_cache((1, 8, 16))
    step = nnx.jit(lambda m, x: m(x))
    token = jnp.ones((1, 1, 16))
    with pytest.raises(ValueError, match=r"decoding \(decode=True\) is not supported"):
        step(mha, token)


@pytest.mark.parametrize("is_causal", [False, True])
def test_window_declared_in_the_factory_maps_windowed_masks(is_causal):
    """A dense sliding-window mask (causal or not) is recognized once the window is declared,
    concrete or traced, and computes jax.nn's windowed attention; soft cap passes through."""
    window = (5, 2)
    i, j = np.arange(SEQ)[:, None], np.arange(SEQ)[None, :]
    mask = (j >= i - 5) & (j <= i + 2) & ((j <= i) if is_causal else True)
    expected = jax.nn.dot_product_attention(*_qkv(), is_causal=is_causal, local_window_size=window)
    fn = jdf.make_attention_fn(local_window_size=window)
    np.testing.assert_allclose(fn(*_qkv(), mask=mask), expected, atol=1e-5)
    declared = jdf.make_attention_fn(is_causal=is_causal, local_window_size=window)
    traced = jax.jit(lambda q, k, v, m: declared(q, k, v, mask=m))
    np.testing.assert_allclose(traced(*_qkv(), mask[None, None]), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"nor all True, each within local_window_size=\(5, 2\)"):
        fn(*_qkv(), mask=np.tril(np.ones((SEQ, SEQ), bool)))
    capped = jdf.make_attention_fn(local_window_size=window, logits_soft_cap=2.0)(*_qkv(),
                                                                                  mask=mask)
    reference = jax_dash.attention(*_qkv(), is_causal=is_causal, local_window_size=window,
                                   logits_soft_cap=2.0)
    np.testing.assert_array_equal(np.asarray(capped), np.asarray(reference))
    assert not np.allclose(capped, expected, atol=1e-3)  # the cap changes the result


def test_factory_validates_window_and_soft_cap():
    with pytest.raises(ValueError, match="local_window_size=.* must not be negative"):
        jdf.make_attention_fn(local_window_size=-1)
    with pytest.raises(ValueError, match="logits_soft_cap=0 must be a finite number > 0"):
        jdf.make_attention_fn(logits_soft_cap=0)
