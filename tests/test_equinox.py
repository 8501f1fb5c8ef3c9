"""jax_dash.equinox: jax_dash in Equinox models, under vmap over batch and heads."""

from __future__ import annotations

import importlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")

import jax_dash  # noqa: E402
import jax_dash.equinox as jde  # noqa: E402

BATCH, SEQ, FEATURES, HEADS, VOCAB = 2, 24, 32, 4, 11
TRAIN_STEPS = 3
LOSS_RTOL, PARAM_ATOL = 1e-5, 1e-4


pytestmark = pytest.mark.usefixtures("on_cpu")  # float32 CPU tests (conftest.py)


def _tokens(seed=0):
    return jax.random.randint(jax.random.key(seed), (BATCH, SEQ + 1), 0, VOCAB)


class Model(eqx.Module):
    """Tiny causal LM around an eqx.nn.MultiheadAttention; ``use_jax_dash`` picks the kernel."""

    embed: eqx.nn.Embedding
    attn: eqx.nn.MultiheadAttention
    head: eqx.nn.Linear
    use_jax_dash: bool = eqx.field(static=True)

    def __init__(self, use_jax_dash, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.embed = eqx.nn.Embedding(VOCAB, FEATURES, key=k1)
        self.attn = eqx.nn.MultiheadAttention(HEADS, FEATURES, key=k2)
        self.head = eqx.nn.Linear(FEATURES, VOCAB, key=k3)
        self.use_jax_dash = use_jax_dash

    def __call__(self, tokens):  # one sequence; vmapped over the batch
        x = jax.vmap(self.embed)(tokens)
        if self.use_jax_dash:
            x = x + jde.multihead_attention(self.attn, x, x, x, is_causal=True)
        else:
            causal = jnp.tril(jnp.ones((tokens.shape[0],) * 2, bool))
            x = x + self.attn(x, x, x, mask=causal)
        return jax.vmap(self.head)(x)


def _train(use_jax_dash):
    model = Model(use_jax_dash, jax.random.key(0))
    tx = optax.adam(1e-2)
    opt_state = tx.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model, opt_state, tokens):
        def loss_fn(model):
            logits = jax.vmap(model)(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = tx.update(grads, opt_state)
        return eqx.apply_updates(model, updates), opt_state, loss

    losses = []
    tokens = _tokens()  # one batch throughout, so the loss must fall
    for _ in range(TRAIN_STEPS):
        model, opt_state, loss = step(model, opt_state, tokens)
        losses.append(float(loss))
    return losses, eqx.filter(model, eqx.is_array)


def test_equinox_model_trains_like_equinox_attention():
    ours_losses, ours = _train(use_jax_dash=True)
    ref_losses, ref = _train(use_jax_dash=False)
    np.testing.assert_allclose(ours_losses, ref_losses, rtol=LOSS_RTOL)
    assert ours_losses[-1] < ours_losses[0]
    ours_leaves, ref_leaves = jax.tree.leaves(ours), jax.tree.leaves(ref)
    assert len(ours_leaves) == len(ref_leaves) > 0
    for a, b in zip(ours_leaves, ref_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=PARAM_ATOL)


def _self_attention_reference(block, x):
    """The block's math with jax.nn.dot_product_attention, on a batch [B, S, d_model]."""
    def project(linear, heads):
        return jax.vmap(jax.vmap(linear))(x).reshape(x.shape[:2] + (heads, block.head_dim))

    q = project(block.query_proj, block.num_heads)
    k = project(block.key_proj, block.num_kv_heads)
    v = project(block.value_proj, block.num_kv_heads)
    out = jax.nn.dot_product_attention(q, k, v, is_causal=block.is_causal)
    return jax.vmap(jax.vmap(block.output_proj))(out.reshape(x.shape[:2] + (-1,)))


@pytest.mark.parametrize("num_kv_heads", [HEADS, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_self_attention_block_under_vmap(num_kv_heads, is_causal):
    block = jde.SelfAttention(FEATURES, HEADS, num_kv_heads=num_kv_heads, is_causal=is_causal,
                              key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (BATCH, SEQ, FEATURES))
    np.testing.assert_allclose(jax.vmap(block)(x), _self_attention_reference(block, x), atol=1e-5)

    def loss(block, fn):
        return jnp.sum(jnp.sin(fn(block, x)))

    ours = eqx.filter_grad(loss)(block, lambda b, x: jax.vmap(b)(x))
    ref = eqx.filter_grad(loss)(block, _self_attention_reference)
    for a, b in zip(jax.tree.leaves(eqx.filter(ours, eqx.is_array)),
                    jax.tree.leaves(eqx.filter(ref, eqx.is_array))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_vmap_over_heads_and_batch_gives_the_same_bits():
    keys = jax.random.split(jax.random.key(2), 4)
    shape = (BATCH, SEQ, HEADS, 16)
    q, k, v, dout = (jax.random.normal(key, shape, jnp.float32) for key in keys)

    per_head = jax.vmap(jax.vmap(lambda q, k, v: jde.single_head_attention(q, k, v, is_causal=True),
                                 in_axes=1, out_axes=1))
    direct = lambda q, k, v: jax_dash.attention(q, k, v, is_causal=True)
    out_vmapped, vjp_vmapped = jax.vjp(per_head, q, k, v)
    out_direct, vjp_direct = jax.vjp(direct, q, k, v)
    # One sequence-head pair's result does not depend on how the batch was formed.
    np.testing.assert_array_equal(out_vmapped, out_direct)
    for a, b in zip(vjp_vmapped(dout), vjp_direct(dout)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(out_direct, jax.nn.dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-5)


def test_multihead_attention_matches_module_call():
    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, use_query_bias=True, use_output_bias=True,
                                    key=jax.random.key(3))
    x = jax.random.normal(jax.random.key(4), (SEQ, FEATURES))
    causal = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    np.testing.assert_allclose(jde.multihead_attention(mha, x, x, x, is_causal=True),
                               mha(x, x, x, mask=causal), atol=1e-5)
    np.testing.assert_allclose(jde.multihead_attention(mha, x, x, x), mha(x, x, x), atol=1e-5)


# ---- attention dropout: Equinox's dropout_p / inference / key, jax_dash's mask -----------------

def _by_hand(mha, x, key, rate, is_causal=True):
    """mha's projections around jax_dash.attention with dropout: what the adapter must give."""
    def heads(proj):
        return jax.vmap(proj)(x).reshape(SEQ, HEADS, -1)

    out = jax_dash.attention(heads(mha.query_proj), heads(mha.key_proj), heads(mha.value_proj),
                             is_causal=is_causal, dropout_rate=rate, dropout_rng=key)
    return jax.vmap(mha.output_proj)(out.reshape(SEQ, -1))


def test_multihead_attention_dropout_is_jax_dash_dropout():
    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, dropout_p=0.25, key=jax.random.key(5))
    x = jax.random.normal(jax.random.key(6), (SEQ, FEATURES))
    key = jax.random.key(7)
    out = jde.multihead_attention(mha, x, x, x, is_causal=True, key=key)
    np.testing.assert_array_equal(out, _by_hand(mha, x, key, 0.25))
    no_dropout = jde.multihead_attention(mha, x, x, x, is_causal=True, inference=True)
    assert not np.allclose(out, no_dropout, atol=1e-3)  # dropout did something
    other = jde.multihead_attention(mha, x, x, x, is_causal=True, key=jax.random.key(8))
    assert not np.array_equal(out, other)


def test_multihead_attention_inference_turns_dropout_off():
    """As eqx.nn.MultiheadAttention: the call's inference, else the module's (which
    eqx.nn.inference_mode sets); dropout_p 0 needs no key."""
    x = jax.random.normal(jax.random.key(9), (SEQ, FEATURES))
    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, dropout_p=0.25, key=jax.random.key(5))
    plain = _by_hand(mha, x, None, 0.0)
    for out in (jde.multihead_attention(mha, x, x, x, is_causal=True, inference=True),
                jde.multihead_attention(eqx.nn.inference_mode(mha), x, x, x, is_causal=True),
                jde.multihead_attention(eqx.nn.MultiheadAttention(HEADS, FEATURES,
                                                                  key=jax.random.key(5)),
                                        x, x, x, is_causal=True)):
        np.testing.assert_array_equal(out, plain)
    # The call's inference=False overrides the module's inference=True.
    evaluating = eqx.nn.inference_mode(mha)
    key = jax.random.key(10)
    np.testing.assert_array_equal(
        jde.multihead_attention(evaluating, x, x, x, is_causal=True, inference=False, key=key),
        _by_hand(mha, x, key, 0.25))
    # Equinox's own module gives its (non-dropout) result there too.
    np.testing.assert_allclose(plain, mha(x, x, x, mask=jnp.tril(jnp.ones((SEQ, SEQ), bool)),
                                          inference=True), atol=1e-5)


def test_dropout_in_training_without_a_key_is_refused():
    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, dropout_p=0.1, key=jax.random.key(5))
    x = jnp.ones((SEQ, FEATURES))
    with pytest.raises(RuntimeError, match=r"dropout_p=0.1 in training mode .* needs a key"):
        jde.multihead_attention(mha, x, x, x, is_causal=True)
    with pytest.raises(RuntimeError, match="requires a key"):  # Equinox's own, for comparison
        mha(x, x, x)


def test_gradients_with_dropout_repeat_bitwise():
    """A batch under vmap with one key per example, gradients of the module's weights: bitwise
    equal run to run; another key gives other gradients."""
    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, dropout_p=0.2, key=jax.random.key(11))
    x = jax.random.normal(jax.random.key(12), (BATCH, SEQ, FEATURES))

    @eqx.filter_jit
    def grads(mha, key):
        def loss(mha):
            keys = jax.random.split(key, BATCH)
            out = jax.vmap(lambda x, k: jde.multihead_attention(mha, x, x, x, is_causal=True,
                                                                key=k))(x, keys)
            return jnp.sum(out ** 2)

        return eqx.filter_grad(loss)(mha)

    first, again = (jax.tree_util.tree_leaves(grads(mha, jax.random.key(13))) for _ in range(2))
    other = jax.tree_util.tree_leaves(grads(mha, jax.random.key(14)))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, c) for a, c in zip(first, other))


def test_self_attention_dropout():
    block = jde.SelfAttention(FEATURES, HEADS, num_kv_heads=2, dropout_p=0.3, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(15), (BATCH, SEQ, FEATURES))
    keys = jax.random.split(jax.random.key(16), BATCH)
    out = jax.vmap(lambda x, k: block(x, key=k))(x, keys)

    def by_hand(x, key):
        head_dim = FEATURES // HEADS
        q = jax.vmap(block.query_proj)(x).reshape(SEQ, HEADS, head_dim)
        k = jax.vmap(block.key_proj)(x).reshape(SEQ, 2, head_dim)
        v = jax.vmap(block.value_proj)(x).reshape(SEQ, 2, head_dim)
        o = jax_dash.attention(q, k, v, scale=1 / np.sqrt(head_dim), is_causal=True,
                               dropout_rate=0.3, dropout_rng=key)
        return jax.vmap(block.output_proj)(o.reshape(SEQ, -1))

    np.testing.assert_array_equal(out, jax.vmap(by_hand)(x, keys))
    plain = jax.vmap(lambda x: block(x, inference=True))(x)
    np.testing.assert_array_equal(jax.vmap(eqx.nn.inference_mode(block))(x), plain)
    assert not np.allclose(out, plain, atol=1e-3)
    with pytest.raises(RuntimeError, match="needs a key"):
        block(x[0])
    with pytest.raises(ValueError, match=re.escape("dropout_p=1.0 must be a Python float in "
                                                   "[0, 1)")):
        jde.SelfAttention(FEATURES, HEADS, dropout_p=1.0, key=jax.random.key(0))


def test_a_traced_dropout_p_is_refused():
    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, dropout_p=0.1, key=jax.random.key(5))
    x = jnp.ones((SEQ, FEATURES))

    @jax.jit
    def run(p):
        traced = eqx.tree_at(lambda m: m.dropout.p, mha, p)
        return jde.multihead_attention(traced, x, x, x, key=jax.random.key(0))

    with pytest.raises(TypeError, match="dropout_p is a traced array"):
        run(0.1)


def test_different_qk_and_vo_sizes_are_refused():
    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, qk_size=16, vo_size=8, key=jax.random.key(6))
    x = jnp.ones((SEQ, FEATURES))
    with pytest.raises(ValueError, match="qk_size=16 and vo_size=8"):
        jde.multihead_attention(mha, x, x, x)
    with pytest.raises(ValueError, match=r"value's head_dim \(8\) must equal query's \(16\)"):
        jde.single_head_attention(jnp.ones((SEQ, 16)), jnp.ones((SEQ, 16)), jnp.ones((SEQ, 8)))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_heads=4 must be a multiple of num_kv_heads=3"):
        jde.SelfAttention(FEATURES, HEADS, num_kv_heads=3, key=jax.random.key(0))
    with pytest.raises(ValueError, match="schedule='fast'"):
        jde.SelfAttention(FEATURES, HEADS, schedule="fast", key=jax.random.key(0))
    block = jde.SelfAttention(FEATURES, HEADS, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"x must be \[seq, d_model\]"):
        block(jnp.ones((BATCH, SEQ, FEATURES)))
    with pytest.raises(ValueError, match=r"query must be \[seq, head_dim\]"):
        jde.single_head_attention(jnp.ones((SEQ, 2, 8)), jnp.ones((SEQ, 8)), jnp.ones((SEQ, 8)))
    with pytest.raises(TypeError, match="mha must be an equinox.nn.MultiheadAttention"):
        jde.multihead_attention(block, jnp.ones((SEQ, FEATURES)), jnp.ones((SEQ, FEATURES)),
                                jnp.ones((SEQ, FEATURES)))


def test_missing_equinox_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "equinox", None)  # makes `import equinox` fail
    monkeypatch.delitem(sys.modules, "jax_dash.equinox")
    try:
        with pytest.raises(ImportError, match=r'pip install equinox .*pip install "\.\[equinox\]"'):
            importlib.import_module("jax_dash.equinox")
    finally:
        # monkeypatch restores sys.modules entries; the package attribute needs restoring too.
        monkeypatch.setattr(jax_dash, "equinox", jde, raising=False)


def test_head_dim_default_and_scale():
    block = jde.SelfAttention(FEATURES, HEADS, key=jax.random.key(0))
    assert block.head_dim == FEATURES // HEADS
    assert block.query_proj.weight.shape == (HEADS * block.head_dim, FEATURES)


def test_equinox_doc_examples_run():
    import pathlib
    import re

    doc = pathlib.Path(__file__).resolve().parents[1] / "docs" / "flax_equinox.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    examples = [b for b in blocks if "import equinox" in b]
    assert len(examples) >= 2
    for code in examples:
        exec(compile(code, "docs/flax_equinox.md", "exec"), {})


def test_structured_masks_under_vmap():
    """SelfAttention with a window, a soft cap, per-sequence lengths and segment ids under vmap
    over the batch equals jax_dash.attention on the batch with the same masks; an
    eqx.nn.MultiheadAttention with a dense window mask equals multihead_attention's window."""
    block = jde.SelfAttention(FEATURES, HEADS, num_kv_heads=2, is_causal=True,
                              local_window_size=(6, 0), logits_soft_cap=3.0,
                              key=jax.random.key(6))
    x = jax.random.normal(jax.random.key(7), (BATCH, SEQ, FEATURES))
    lengths = jnp.asarray([SEQ - 5, 9], jnp.int32)
    segments = jnp.asarray(np.repeat([[0, 1, 1, 2], [0, 0, 1, 1]], SEQ // 4, axis=1), jnp.int32)
    ours = jax.vmap(lambda x, n, s: block(x, seq_length=n, segment_ids=s))(x, lengths, segments)

    def project(linear, heads):
        return jax.vmap(jax.vmap(linear))(x).reshape(x.shape[:2] + (heads, block.head_dim))

    out = jax_dash.attention(project(block.query_proj, HEADS), project(block.key_proj, 2),
                             project(block.value_proj, 2), is_causal=True,
                             local_window_size=(6, 0), logits_soft_cap=3.0,
                             query_seq_lengths=lengths, key_value_seq_lengths=lengths,
                             query_segment_ids=segments, key_value_segment_ids=segments)
    expected = jax.vmap(jax.vmap(block.output_proj))(out.reshape(x.shape[:2] + (-1,)))
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(expected))

    mha = eqx.nn.MultiheadAttention(HEADS, FEATURES, key=jax.random.key(8))
    i, j = np.arange(SEQ)[:, None], np.arange(SEQ)[None, :]
    window = (j >= i - 4) & (j <= i + 1)
    np.testing.assert_allclose(
        jde.multihead_attention(mha, x[0], x[0], x[0], local_window_size=(4, 1)),
        mha(x[0], x[0], x[0], mask=jnp.asarray(window)), atol=1e-5)


def test_self_attention_validates_window_and_soft_cap():
    with pytest.raises(ValueError, match="local_window_size=.* must not be negative"):
        jde.SelfAttention(FEATURES, HEADS, local_window_size=(-1, 0), key=jax.random.key(0))
    with pytest.raises(TypeError, match="logits_soft_cap must be None or a Python number"):
        jde.SelfAttention(FEATURES, HEADS, logits_soft_cap="2", key=jax.random.key(0))
