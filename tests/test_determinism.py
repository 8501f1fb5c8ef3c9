"""check_determinism: what it reports in programs lowered for the GPU (from the StableHLO, so on
this CPU machine too), its bitwise run comparison, and its errors."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash
from helpers import GPU_MARKS
from jax.experimental import io_callback
from jax_dash.determinism import check_determinism

pytestmark = pytest.mark.usefixtures("on_cpu")  # the run comparisons run on the CPU: conftest.py

SCATTER_ADD = "scatter-add"
ATOMIC = "jax_dash attention schedule='atomic'"


def gpu_test(test):
    for mark in GPU_MARKS:
        test = mark(test)
    return test


def line_of(marker):
    """The line of this file that holds ``# <marker>`` (findings must point at it)."""
    with open(__file__) as source:
        lines = [i for i, text in enumerate(source, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(lines) == 1, marker
    return lines[0]


def gpu_findings(fn, *args, **kwargs):
    report = check_determinism(fn, *args, platform="gpu", **kwargs)
    assert report.identical is None and not report.ok  # never run on another platform
    return report.findings


def assert_points_at(finding, marker):
    path, line = finding.source.rsplit(":", 1)
    assert os.path.basename(path) == "test_determinism.py", finding.source
    assert int(line) == line_of(marker), finding.source


# ---- programs ------------------------------------------------------------------------------------

def embedding_step(params, ids, targets):
    """A training step's gradient through a gather embedding: table[ids]'s grad is a scatter-add."""
    def loss(params):
        hidden = params["table"][ids]  # gather embedding
        return jnp.mean((hidden @ params["w"] - targets) ** 2)
    return jax.grad(loss)(params)


def cross_entropy_step(params, x, labels):
    """An MLP and a cross-entropy whose take_along_axis puts one point per row: no collision."""
    def loss(params):
        logits = jnp.tanh(x @ params["w1"]) @ params["w2"]
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(log_probs, labels[..., None], axis=-1).mean()
    return jax.grad(loss)(params)


def mlp_step(params, x, y):
    return jax.grad(lambda p: jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"] - y) ** 2))(params)


def max_pool_grad(x, window, stride):
    def pool(x):
        dims, strides = (1, window, window, 1), (1, stride, stride, 1)
        pooled = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, dims, strides, "VALID")  # max pool
        return pooled.sum()
    return jax.grad(pool)(x)


def attention_grad(q, schedule):
    def loss(q):
        return jax_dash.attention(q, q, q, schedule=schedule).astype(jnp.float32).sum()  # attention
    return jax.grad(loss)(q)


def cudnn_backward(x):
    # jax.nn.dot_product_attention(implementation="cudnn") cannot be traced without a GPU (it asks
    # cuDNN for its version), so this stands in with a custom call of cuDNN's backward target name
    # lowered for cuda: the scanner recognizes the target name, whatever the operands.
    result = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.ffi.ffi_call("__cudnn$fmhaSoftmaxBackward", result)(x)  # cudnn call


def embedding_params():
    return {"table": jnp.ones((16, 8)), "w": jnp.ones((8, 2))}


IDS = jnp.array([1, 3, 1, 0, 3, 1], jnp.int32)


# ---- what is reported on the GPU -----------------------------------------------------------------

def test_gather_embedding_gradient_is_reported_at_the_lookup():
    (finding,) = gpu_findings(embedding_step, embedding_params(), IDS, jnp.ones((6, 2)))
    assert finding.op == SCATTER_ADD
    assert "jax_dash.embed" in finding.fix and "jax_dash.segment_sum" in finding.fix
    assert_points_at(finding, "gather embedding")


def test_scatter_add_and_segment_sum_are_reported():
    x, values = jnp.zeros(8), jnp.ones(6)
    (add,) = gpu_findings(lambda x, v: x.at[IDS].add(v), x, values)
    (segments,) = gpu_findings(lambda v: jax.ops.segment_sum(v, IDS, num_segments=4), values)
    assert add.op == segments.op == SCATTER_ADD


def test_scatters_that_cannot_race_are_not_reported():
    x, values = jnp.zeros(8), jnp.ones(6)
    unique = jnp.arange(6, dtype=jnp.int32)
    assert gpu_findings(lambda x, v: x.at[unique].add(v, unique_indices=True), x, values) == []
    # integer adds are exact, and max is order-free
    assert gpu_findings(lambda x: x.at[IDS].add(1), jnp.zeros(8, jnp.int32)) == []
    assert gpu_findings(lambda x, v: x.at[IDS].max(v), x, values) == []


def test_overwrite_scatter_is_reported():
    (finding,) = gpu_findings(lambda x, v: x.at[IDS].set(v), jnp.zeros(8), jnp.ones(6))
    assert finding.op == "scatter (overwrite)"
    assert "unspecified" in finding.why


def test_overlapping_max_pool_gradient_is_reported():
    x = jnp.arange(2 * 8 * 8 * 3, dtype=jnp.float32).reshape(2, 8, 8, 3)
    (finding,) = gpu_findings(functools.partial(max_pool_grad, window=3, stride=1), x)
    assert finding.op == "select_and_scatter"
    assert_points_at(finding, "max pool")
    # stride = window: every input position is in one window, so one add each
    assert gpu_findings(functools.partial(max_pool_grad, window=2, stride=2), x) == []


def test_cross_entropy_and_mlp_gradients_are_not_reported():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5, 8), np.float32)
    params = {"w1": rng.standard_normal((8, 16), np.float32), "w2": np.ones((16, 10), np.float32)}
    labels = jnp.array([[1, 2, 3, 4, 5]] * 4, jnp.int32)
    assert gpu_findings(cross_entropy_step, params, x, labels) == []
    assert gpu_findings(mlp_step, params, x, jnp.ones((4, 5, 10))) == []


def test_atomic_attention_schedule_is_reported_and_auto_is_not():
    q = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
    (finding,) = gpu_findings(functools.partial(attention_grad, schedule="atomic"), q)
    assert finding.op == ATOMIC and "schedule='auto'" in finding.fix
    assert_points_at(finding, "attention")
    for schedule in ("auto", "descending"):
        assert gpu_findings(functools.partial(attention_grad, schedule=schedule), q) == []


def test_atomic_attention_is_reported_under_a_sharding():
    # Over several devices jax_dash's attention lowers to a custom_partitioning call whose body
    # the StableHLO does not show; the check lowers that body alone.
    devices = jax.devices("cpu")
    if len(devices) < 2:
        pytest.skip("needs the virtual CPU devices of conftest.py")
    mesh = jax.sharding.Mesh(np.array(devices[:2]), ("batch",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch"))
    q = jax.device_put(jnp.ones((2, 128, 2, 64), jnp.bfloat16), sharding)
    (finding,) = gpu_findings(functools.partial(attention_grad, schedule="atomic"), q)
    assert finding.op == ATOMIC


def test_cudnn_attention_backward_is_reported():
    (finding,) = gpu_findings(cudnn_backward, jnp.ones((4, 8)))
    assert finding.op == "cudnn attention backward"
    assert "jax_dash.attention" in finding.fix
    assert_points_at(finding, "cudnn call")


def test_jax_dash_embed_and_segment_sum_are_not_reported():
    if not hasattr(jax_dash, "embed"):
        pytest.skip("jax_dash.embed is not there yet (jax_dash/embedding.py)")

    def step(params, ids, targets):
        def loss(params):
            hidden = jax_dash.embed(params["table"], ids)
            return jnp.mean((hidden @ params["w"] - targets) ** 2)
        return jax.grad(loss)(params)

    assert gpu_findings(step, embedding_params(), IDS, jnp.ones((6, 2))) == []
    assert gpu_findings(lambda v: jax_dash.segment_sum(v, IDS, 4), jnp.ones((6, 3))) == []


def test_source_skips_library_frames():
    flax = pytest.importorskip("flax.linen")

    class Model(flax.Module):
        @flax.compact
        def __call__(self, ids):
            return flax.Embed(16, 8)(ids)  # flax embed

    model = Model()
    params = model.init(jax.random.PRNGKey(0), IDS)
    (finding,) = gpu_findings(jax.grad(lambda p: model.apply(p, IDS).sum()), params)
    assert_points_at(finding, "flax embed")


# ---- what it does on the CPU, and the run comparison ---------------------------------------------

def test_cpu_runs_are_compared_bitwise():
    report = check_determinism(embedding_step, embedding_params(), IDS, jnp.ones((6, 2)),
                               platform="cpu", runs=3)
    assert report.findings == [] and report.identical is True and report.ok
    assert report.runs == 3 and "identical" in str(report)
    # the CPU kernels add dQ in ticket order whatever the schedule: "atomic" too
    q = np.random.default_rng(1).standard_normal((1, 64, 2, 32), np.float32)
    assert check_determinism(functools.partial(attention_grad, schedule="atomic"), q).ok


def test_outputs_that_change_are_caught():
    calls = []

    def counter():
        calls.append(None)
        return np.float32(len(calls))

    def program(x):
        return x + io_callback(counter, jax.ShapeDtypeStruct((), jnp.float32))

    report = check_determinism(program, jnp.zeros(3))
    assert report.identical is False and not report.ok
    # NaNs compare by their bits, so a NaN output is identical to itself
    assert check_determinism(lambda x: x / x, jnp.zeros(3)).identical is True


def test_runs_zero_and_other_platforms_do_not_run():
    report = check_determinism(mlp_step, {"w1": jnp.ones((3, 4)), "w2": jnp.ones((4, 2))},
                               jnp.ones((5, 3)), jnp.ones((5, 2)), runs=0)
    assert report.identical is None and not report.ok and report.reason == "runs=0"
    report = check_determinism(lambda x: x.at[IDS].add(1.0), jnp.zeros(8), platform="cuda")
    assert report.platform == "cuda" and "not the current backend" in report.reason
    assert "scatter-add" in str(report) and "not ok" in str(report)


def test_jitted_function_keeps_its_static_arguments():
    @functools.partial(jax.jit, static_argnames="n")
    def scale(x, n):
        return x * n

    assert check_determinism(scale, jnp.ones(3), n=2).ok


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(fn=3), TypeError, r"fn must be callable .* got 3"),
    (dict(platform="tpu"), ValueError, r"platform='tpu' is not supported; allowed: .*'cpu', 'gpu'"),
    (dict(platform="rocm"), ValueError, r"platform='rocm'"),
    (dict(platform=0), ValueError, r"platform=0"),
    (dict(runs=1), ValueError, r"runs must be 0 .* or an int >= 2 .* got 1"),
    (dict(runs=-2), ValueError, r"runs must be .* got -2"),
    (dict(runs=2.0), ValueError, r"runs must be .* got 2.0"),
    (dict(runs=True), ValueError, r"runs must be .* got True"),
])
def test_bad_arguments(kwargs, error, pattern):
    fn = kwargs.pop("fn", jnp.sin)
    with pytest.raises(error, match=pattern):
        check_determinism(fn, jnp.ones(3), **kwargs)


# ---- on a GPU ------------------------------------------------------------------------------------

@gpu_test
def test_gpu_cudnn_attention_gradient_is_reported():
    q = jax.random.normal(jax.random.PRNGKey(0), (2, 256, 4, 64), jnp.bfloat16)

    def loss(q):
        out = jax.nn.dot_product_attention(q, q, q, implementation="cudnn")
        return out.astype(jnp.float32).sum()

    report = check_determinism(jax.grad(loss), q, runs=0)
    assert report.platform == "cuda"
    assert "cudnn attention backward" in [finding.op for finding in report.findings]


@gpu_test
def test_gpu_deterministic_program_is_ok():
    q = jax.random.normal(jax.random.PRNGKey(0), (2, 512, 4, 64), jnp.bfloat16)
    report = check_determinism(functools.partial(attention_grad, schedule="auto"), q, runs=2)
    assert report.platform == "cuda" and report.ok, str(report)
