"""jax_dash.dropout_keep_mask: the keep mask of attention dropout (issue 33), a pure function of
(key, global coordinates). Philox4x32-10 against Random123's known answers, the jnp definition
against cuda/dropout.h (the function the kernels call) bit for bit, offsets composing, the kept
fraction, keys, and bad input."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from jax_dash import _ffi
from jax_dash import dropout

# Random123's kat_vectors: counter, key, Philox4x32-10 output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_known_answers(counter, key, expected):
    assert tuple(int(x) for x in dropout._philox4x32_10(counter, key)) == expected
    assert _ffi._ext.philox4x32_10(*counter, *key) == expected


def _native_mask(rng, rate, shape, offsets=(0, 0, 0, 0)):
    key0, key1 = (int(w) for w in dropout.dropout_key_words(rng))
    return _ffi._ext.dropout_keep_mask(key0, key1, dropout.dropout_threshold(rate), *shape,
                                       *offsets).astype(bool)


@pytest.mark.parametrize("seed, rate, shape, offsets", [
    (0, 0.1, (2, 3, 40, 50), (0, 0, 0, 0)),
    (1, 0.5, (1, 2, 33, 17), (3, 5, 100, 7)),
    (2, 0.9, (2, 1, 16, 64), (0, 7, 48, 4096)),
    (3, 0.25, (1, 1, 1, 1), (2 ** 32 - 1, 0, 2 ** 31, 2 ** 32 - 1)),
])
def test_keep_mask_is_the_kernels_definition(seed, rate, shape, offsets):
    """jnp (dropout_keep_mask) and C++ (cuda/dropout.h, which the kernels call) agree bit for
    bit, offsets included (up to the uint32 coordinates' last value)."""
    rng = jax.random.key(seed)
    ours = dropout.dropout_keep_mask(rng, rate, shape, batch_offset=offsets[0],
                                     head_offset=offsets[1], q_offset=offsets[2],
                                     kv_offset=offsets[3])
    assert ours.shape == shape and ours.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(ours), _native_mask(rng, rate, shape, offsets))


def test_a_block_is_the_slice_of_the_whole_mask():
    rng = jax.random.key(4)
    whole = np.asarray(jax_dash.dropout_keep_mask(rng, 0.3, (3, 4, 70, 90)))
    block = jax_dash.dropout_keep_mask(rng, 0.3, (2, 2, 33, 41), batch_offset=1, head_offset=2,
                                       q_offset=20, kv_offset=37)
    np.testing.assert_array_equal(np.asarray(block), whole[1:3, 2:4, 20:53, 37:78])


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_kept_fraction(rate):
    """About 1 - rate of the elements are kept (within 5 standard deviations), and the draws are
    not correlated between neighbours along either sequence axis."""
    mask = np.asarray(jax_dash.dropout_keep_mask(jax.random.key(5), rate, (2, 4, 128, 256)))
    n, keep = mask.size, 1 - dropout.dropout_threshold(rate) / 65536
    assert abs(mask.mean() - keep) <= 5 * math.sqrt(keep * (1 - keep) / n), mask.mean()
    for axis in (2, 3):
        a, b = np.moveaxis(mask, axis, 0)[:-1], np.moveaxis(mask, axis, 0)[1:]
        both = np.mean(a & b)
        assert abs(both - keep * keep) <= 5 * math.sqrt(keep * keep / n) + 1e-3, (axis, both)


def test_rate_zero_keeps_everything_and_the_threshold():
    assert bool(jnp.all(jax_dash.dropout_keep_mask(jax.random.key(6), 0.0, (1, 2, 16, 16))))
    assert dropout.dropout_threshold(0.0) == 0
    assert dropout.dropout_threshold(0.1) == 6554  # floor(6553.6 + 0.5)
    assert dropout.dropout_threshold(0.5) == 32768
    assert dropout.dropout_threshold(1 - 2 ** -20) == 65535


def test_same_key_same_mask_other_key_other_mask():
    shape = (1, 2, 32, 32)
    a, b = (np.asarray(jax_dash.dropout_keep_mask(jax.random.key(7), 0.5, shape))
            for _ in range(2))
    c = np.asarray(jax_dash.dropout_keep_mask(jax.random.key(8), 0.5, shape))
    np.testing.assert_array_equal(a, b)
    assert np.mean(a != c) > 0.3


def test_typed_and_raw_keys_give_the_same_mask():
    typed = jax.random.key(9)
    raw = jax.random.key_data(typed)
    shape = (1, 1, 16, 32)
    np.testing.assert_array_equal(np.asarray(jax_dash.dropout_keep_mask(typed, 0.2, shape)),
                                  np.asarray(jax_dash.dropout_keep_mask(raw, 0.2, shape)))


def test_under_jit_with_a_traced_key():
    fn = jax.jit(lambda rng: jax_dash.dropout_keep_mask(rng, 0.2, (1, 2, 16, 24), q_offset=8))
    rng = jax.random.key(10)
    np.testing.assert_array_equal(np.asarray(fn(rng)), _native_mask(rng, 0.2, (1, 2, 16, 24),
                                                                    (0, 0, 8, 0)))


@pytest.mark.parametrize("rate, error, message", [
    (-0.1, ValueError, "dropout_rate must be in [0, 1), got -0.1"),
    (1.0, ValueError, "dropout_rate must be in [0, 1), got 1.0"),
    (float("nan"), ValueError, "dropout_rate must be in [0, 1), got nan"),
    ("0.1", TypeError, "dropout_rate must be a float in [0, 1), got '0.1'"),
    (True, TypeError, "dropout_rate must be a float in [0, 1), got True"),
])
def test_bad_rates(rate, error, message):
    with pytest.raises(error, match=re.escape(message)):
        jax_dash.dropout_keep_mask(jax.random.key(0), rate, (1, 1, 4, 4))


def test_traced_rate():
    with pytest.raises(TypeError, match="dropout_rate must be a Python float, not a traced value"):
        jax.jit(lambda r: jax_dash.dropout_keep_mask(jax.random.key(0), r, (1, 1, 4, 4)))(0.1)


@pytest.mark.parametrize("rng, error, message", [
    (None, ValueError, "dropout_rng is required when dropout_rate > 0"),
    (np.zeros(3, np.uint32), TypeError, "dropout_rng must be a JAX PRNG key"),
    (np.zeros(2, np.int32), TypeError, "dropout_rng must be a JAX PRNG key"),
    ("key", TypeError, "dropout_rng must be a JAX PRNG key"),
])
def test_bad_keys(rng, error, message):
    with pytest.raises(error, match=message):
        jax_dash.dropout_keep_mask(rng, 0.1, (1, 1, 4, 4))


def test_a_batch_of_keys_is_refused():
    with pytest.raises(TypeError, match=r"dropout_rng must be one key \(shape \(\)\)"):
        jax_dash.dropout_keep_mask(jax.random.split(jax.random.key(0), 2), 0.1, (1, 1, 4, 4))


@pytest.mark.parametrize("shape, kwargs, message", [
    ((1, 1, 4), {}, "shape must be (batch, heads, seq_q, seq_kv)"),
    ((1, -1, 4, 4), {}, "shape's heads must be a non-negative int, got -1"),
    ((1, 1, 4.0, 4), {}, "shape's seq_q must be a non-negative int, got 4.0"),
    ((1, 1, 4, 4), {"q_offset": -1}, "q_offset must be a non-negative int, got -1"),
    ((1, 1, 4, 4), {"kv_offset": 2 ** 32 - 2}, "seq_kv: 4 positions from offset 4294967294 go "
                                               "past 2^32"),
])
def test_bad_shapes_and_offsets(shape, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        jax_dash.dropout_keep_mask(jax.random.key(0), 0.1, shape, **kwargs)
