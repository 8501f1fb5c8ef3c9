"""Test configuration: 8 virtual CPU devices for the sharding tests (must precede importing jax)."""

import os

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# Under pytest-xdist (README's `pytest -q -n auto`: one worker process per core) the workers share
# a GPU: each allocates on demand instead of taking 75% of its memory up front.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


import jax  # noqa: E402  (after XLA_FLAGS is set)
import pytest  # noqa: E402


@pytest.fixture
def on_cpu(request):
    """Pins a CPU test (float32 models) to the CPU device also where a GPU is the default;
    tests marked `gpu` keep the default device. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("on_cpu")``."""
    if request.node.get_closest_marker("gpu"):
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield
