"""The CPU kernels' thread pool (cuda/cpu/thread_pool.h): one pool for the process, a bounded and
validated JAX_DASH_CPU_THREADS, a default that respects CPU affinity, and no abort when worker
threads cannot be created. Pool behaviour is observed in fresh processes (its threads are
process-wide state)."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_dash

pytestmark = pytest.mark.usefixtures("on_cpu")  # the CPU kernels: conftest.py

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs in a fresh process: `threads()` is the process's thread count, `run()` one jitted forward
# and backward on the CPU (compiled on the first call), returning its bits.
PRELUDE = """
import json, os, resource
import jax, jax.numpy as jnp, numpy as np
import jax_dash

def threads():
    return len(os.listdir("/proc/self/task"))

def tids():
    return sorted(os.listdir("/proc/self/task"))

q = jax.random.normal(jax.random.PRNGKey(0), (2, 96, 4, 32), jnp.float32)
step = jax.jit(jax.value_and_grad(
    lambda q: jnp.sum(jnp.sin(jax_dash.attention(q, q, q, is_causal=True)))))

def run():
    value, grad = step(q)
    return np.asarray(grad)
"""


def _fresh_process(code, one_cpu=False):
    """Runs PRELUDE + code in a new interpreter (on one CPU, for every thread, if asked) and
    returns the JSON its last line prints."""
    # Pinned before anything starts a thread: threads inherit the mask of their creator.
    pin = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
    result = subprocess.run([sys.executable, "-c", (pin if one_cpu else "") + PRELUDE + code],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", ["40000", "1025", "0", "-2", "four", "3.5"])
def test_bad_thread_counts_are_an_error_naming_the_variable(monkeypatch, value):
    q = jnp.ones((1, 16, 2, 32), jnp.float32)
    monkeypatch.setenv("JAX_DASH_CPU_THREADS", value)
    with pytest.raises(jax.errors.JaxRuntimeError,
                       match=f"INVALID_ARGUMENT: .*JAX_DASH_CPU_THREADS='{value}' is not allowed: "
                             "it must be an integer from 1 to 1024"):
        jax.block_until_ready(jax_dash.attention(q, q, q))


def test_largest_thread_count_runs(monkeypatch):
    q = jax.random.normal(jax.random.PRNGKey(1), (1, 16, 2, 32), jnp.float32)
    expected = np.asarray(jax_dash.attention(q, q, q))
    monkeypatch.setenv("JAX_DASH_CPU_THREADS", "1024")  # far more threads than tasks: capped
    np.testing.assert_array_equal(jax_dash.attention(q, q, q), expected)


def test_pool_lives_with_the_process():
    """Workers are created once and reused: after the first call the process keeps them (the old
    code created and joined fresh threads in every call), and later calls add none."""
    baseline, after_first, after_more, same_threads = _fresh_process("""
os.environ["JAX_DASH_CPU_THREADS"] = "1"
run()  # compiles; single-threaded: no pool yet
baseline = threads()
os.environ["JAX_DASH_CPU_THREADS"] = "4"
run()
after_first, first_tids = threads(), tids()
for _ in range(5):
    run()
print(json.dumps([baseline, after_first, threads(), tids() == first_tids]))
""")
    assert after_first == baseline + 3  # 4 threads = the caller + 3 pool workers
    assert after_more == after_first and same_threads


def test_default_thread_count_follows_cpu_affinity():
    """A process allowed one CPU (as by taskset or a CPU set) gets no pool workers by default:
    it adds exactly the threads that a run pinned to one thread adds (XLA's own, if any)."""
    code = """
baseline = threads()
run()
print(json.dumps([baseline, threads()]))
"""
    baseline, after = _fresh_process(code, one_cpu=True)
    baseline_1, after_1 = _fresh_process('os.environ["JAX_DASH_CPU_THREADS"] = "1"\n' + code,
                                         one_cpu=True)
    assert after - baseline == after_1 - baseline_1
    # And on this machine's CPUs the default does use a pool where there is more than one.
    if len(os.sched_getaffinity(0)) > 1:
        baseline_n, after_n = _fresh_process(code)
        assert after_n - baseline_n > after_1 - baseline_1


def test_threads_that_cannot_be_created_shrink_the_pool_instead_of_aborting():
    """An address-space limit just above what is mapped leaves room for a few thread stacks only:
    the old pool called std::terminate (the process aborted); now the pool stays smaller and the
    bits are those of one thread."""
    expected, got, added = _fresh_process("""
os.environ["JAX_DASH_CPU_THREADS"] = "1"
expected = run()  # compiled and run before the limit
vm_kb = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1])
before = threads()
resource.setrlimit(resource.RLIMIT_AS, (vm_kb * 1024 + (96 << 20), resource.RLIM_INFINITY))
os.environ["JAX_DASH_CPU_THREADS"] = "200"  # 8 MiB stacks: most cannot be mapped
got = run()
print(json.dumps([expected.tolist(), got.tolist(), threads() - before]))
""")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    assert 0 <= added < 199, added  # the pool stayed smaller than asked
