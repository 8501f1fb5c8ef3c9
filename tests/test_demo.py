"""The reproducible-training demo, at tiny settings: runs, agrees bitwise, reports honestly."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from helpers import hopper_devices
from jax_dash import demo

TINY = dict(steps=4, seq=32, layers=1, heads=2, head_dim=16, batch=2, dtype="float32")
TINY_ARGS = ["--steps", "3", "--seq", "32", "--layers", "1", "--heads", "2", "--head-dim", "16",
             "--batch", "2", "--dtype", "float32"]


pytestmark = pytest.mark.usefixtures("on_cpu")  # float32 CPU tests (conftest.py)


def _fresh_import(module, name, monkeypatch):
    """Executes ``module``'s source again as a new module (the loaded one stays as it is)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, module.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, fresh)  # dataclasses look their module up there
    spec.loader.exec_module(fresh)
    return fresh


def test_schedule_choices_come_from_the_package(monkeypatch):
    import jax_dash.attention  # noqa: F401  (the module, not the function of that name)

    attention_module = sys.modules["jax_dash.attention"]
    assert demo.SCHEDULE_CHOICES == attention_module.SCHEDULES
    # Derived, not a copy: a schedule added to the package reaches the demo's choices.
    monkeypatch.setattr(attention_module, "SCHEDULES", attention_module.SCHEDULES + ("new",))
    assert _fresh_import(demo, "_fresh_demo", monkeypatch).SCHEDULE_CHOICES[-1] == "new"


def test_corpus_ships_with_package():
    text = demo.load_corpus()
    assert len(text) > 4096
    assert len(set(text)) > 30


def test_two_jax_dash_runs_are_bitwise_identical():
    result = demo.run_demo(demo.DemoConfig(**TINY))
    first, second = result.runs
    assert result.identical
    assert first.digest == second.digest
    assert first.losses == second.losses
    for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(second.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert all(np.isfinite(first.losses))
    assert first.losses[-1] < first.losses[0], first.losses  # it does train


def test_jax_dash_training_matches_xla_attention():
    ours = demo.run_demo(demo.DemoConfig(**TINY, attention="jax_dash"), runs=1).runs[0]
    xla = demo.run_demo(demo.DemoConfig(**TINY, attention="xla"), runs=1).runs[0]
    np.testing.assert_allclose(ours.losses, xla.losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ours.params), jax.tree.leaves(xla.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4)


def test_digest_sees_one_ulp_and_seed_changes():
    cfg = demo.DemoConfig(**TINY)
    params, _ = demo.Trainer(cfg, vocab_size=10).init()
    base = demo.params_digest(params)
    assert demo.params_digest(demo.Trainer(cfg, vocab_size=10).init()[0]) == base
    leaves, treedef = jax.tree_util.tree_flatten(params)
    bumped = np.asarray(leaves[0]).copy()
    bumped.flat[5] = np.nextafter(bumped.flat[5], np.float32(np.inf))
    one_ulp = jax.tree_util.tree_unflatten(treedef, [bumped] + leaves[1:])
    assert demo.params_digest(one_ulp) != base
    other, _ = demo.Trainer(demo.DemoConfig(**{**TINY, "seed": 1}), vocab_size=10).init()
    assert demo.params_digest(other) != base


def test_model_is_flax_nnx_with_jax_dash_attention(monkeypatch):
    from flax import nnx

    import jax_dash

    calls = []
    original = jax_dash.attention

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(jax_dash, "attention", counting)
    cfg = demo.DemoConfig(**{**TINY, "layers": 2}, schedule="descending")
    model = demo.build_model(cfg, vocab_size=10)
    assert isinstance(model, nnx.Module)
    attention_layers = [m for _, m in nnx.iter_graph(model)
                        if isinstance(m, nnx.MultiHeadAttention)]
    assert len(attention_layers) == 2
    demo.prepare(cfg)  # traces the training step: every layer's attention is jax_dash's
    assert len(calls) == 2 and all(c["is_causal"] and c["schedule"] == "descending" for c in calls)


def test_batches_fixed_by_seed():
    tokens = np.arange(500, dtype=np.int32)
    cfg = demo.DemoConfig(**TINY)
    first, again = demo.make_batches(tokens, cfg), demo.make_batches(tokens, cfg)
    np.testing.assert_array_equal(first, again)
    assert first.shape == (TINY["steps"], TINY["batch"], TINY["seq"] + 1)
    other = demo.make_batches(tokens, demo.DemoConfig(**{**TINY, "seed": 3}))
    assert not np.array_equal(first, other)


def test_main_reports_identical_runs_and_keeps_progress_off_stdout():
    out, progress = io.StringIO(), io.StringIO()
    assert demo.main([*TINY_ARGS, "--no-contrast"], out=out, progress=progress) == 0
    text = out.getvalue()
    assert "IDENTICAL" in text and "DIFFERENT" not in text
    digests = [line.split("sha256 ")[1] for line in text.splitlines() if "sha256" in line]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert "step 3/3" in progress.getvalue()
    assert "step 3/3" not in text


def test_module_command_runs_as_documented():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "jax_dash.demo", *TINY_ARGS],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "final parameters: IDENTICAL" in proc.stdout
    assert "run 2/2" in proc.stderr


def _fake_result(attention, digests, schedule="auto"):
    cfg = demo.DemoConfig(**TINY, attention=attention, schedule=schedule)
    params = [{"w": np.zeros(2, np.float32)}, {"w": np.array([0, 0.5], np.float32)}]
    runs = [demo.RunResult([2.0, 1.5], d, 1.0, p) for d, p in zip(digests, params)]
    return demo.DemoResult(cfg, runs)


def test_report_says_plainly_when_runs_differ():
    out = io.StringIO()
    demo.report(_fake_result("cudnn", ["aa", "bb"]), out)
    text = out.getvalue()
    assert "DIFFERENT" in text and "NOT reproducible" in text and "atomics" in text
    assert "largest difference 0.5" in text

    out = io.StringIO()
    demo.report(_fake_result("jax_dash", ["aa", "bb"]), out)
    assert "bug" in out.getvalue()

    out = io.StringIO()
    demo.report(_fake_result("jax_dash", ["aa", "bb"], schedule="atomic"), out)
    assert "bug" not in out.getvalue() and "atomic" in out.getvalue()


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="steps=0"):
        demo.DemoConfig(**{**TINY, "steps": 0})
    with pytest.raises(ValueError, match="attention='flash'"):
        demo.DemoConfig(**TINY, attention="flash")
    with pytest.raises(ValueError, match="seq=100000"):
        demo.make_batches(np.arange(1000, dtype=np.int32), demo.DemoConfig(**{**TINY, "seq": 100000}))
    with pytest.raises(SystemExit):
        demo.main(["--steps", "0"], out=io.StringIO())
    with pytest.raises(SystemExit):
        demo.main(["--attention", "xla", "--schedule", "shift"], out=io.StringIO())


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the message shown without a GPU")
def test_cudnn_without_gpu_is_a_clear_error(capsys):
    with pytest.raises(demo.DemoSetupError, match="needs an NVIDIA GPU"):
        demo.make_attention_fn(demo.DemoConfig(**TINY, attention="cudnn"))
    with pytest.raises(SystemExit) as exit_info:
        demo.main([*TINY_ARGS, "--attention", "cudnn"], out=io.StringIO())
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--attention cudnn needs an NVIDIA GPU" in err


def test_settings_the_kernels_cannot_run_are_one_line_errors(capsys):
    args = [a if a != "16" else "20" for a in TINY_ARGS]  # --head-dim 20: not a multiple of 8
    assert "20" in args
    with pytest.raises(SystemExit) as exit_info:
        demo.main(args, out=io.StringIO())
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "head_dim=20" in err and "Traceback" not in err


def test_cpu_run_names_its_device_and_why_there_is_no_contrast():
    if jax.default_backend() == "gpu":
        pytest.skip("checks the CPU message")
    out = io.StringIO()
    assert demo.main([*TINY_ARGS, "--quiet"], out=out) == 0
    text = out.getvalue()
    assert text.startswith("jax_dash demo, device: ") and "(cpu" in text
    assert "XLA's own attention is reproducible too" in text and "contrast" in text
    assert "cuDNN" in text and text.count("params sha256") == 2  # no cuDNN runs on a CPU


def test_device_line_says_how_to_get_a_cuda_jax(monkeypatch):
    if jax.default_backend() == "gpu":
        pytest.skip("checks the CPU message")
    monkeypatch.setattr(demo, "_gpu_hardware_visible", lambda: False)
    assert "note" not in demo.describe_device()
    monkeypatch.setattr(demo, "_gpu_hardware_visible", lambda: True)
    line = demo.describe_device()
    assert "runs on the CPU" in line and 'pip install "jax[cuda13]' in line


def test_missing_flax_is_a_one_line_error_naming_the_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optax", None)  # makes `import optax` raise ImportError
    with pytest.raises(demo.DemoSetupError, match=r'pip install "\.\[demo\]"'):
        demo.Trainer(demo.DemoConfig(**TINY), vocab_size=10)
    with pytest.raises(SystemExit) as exit_info:
        demo.main(TINY_ARGS, out=io.StringIO())
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs both" in err


def test_gpu_flow_runs_the_contrast_after_jax_dash(monkeypatch):
    """The GPU control flow, run on the CPU: a backend reported as "gpu", XLA as the contrast."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(demo, "CONTRAST_ATTENTION", "xla")
    out = io.StringIO()
    assert demo.main([*TINY_ARGS, "--quiet"], out=out) == 0
    text = out.getvalue()
    first, contrast = text.split("\ncontrast: ")
    assert "attention jax_dash" in first and "final parameters: IDENTICAL" in first
    assert "implementation='xla'" in contrast and "attention xla" in contrast
    assert text.count("params sha256") == 4 and "needs an NVIDIA GPU" not in text
    out = io.StringIO()
    assert demo.main([*TINY_ARGS, "--quiet", "--no-contrast"], out=out) == 0
    assert "contrast" not in out.getvalue() and out.getvalue().count("params sha256") == 2


def test_defaults_per_backend():
    cpu = demo.default_config("cpu")
    assert cpu.dtype == "float32"
    gpu = demo.default_config("gpu")
    # The Hopper kernels take bf16/fp16 and head_dim 64 or 128; the GPU default must fit them.
    assert gpu.dtype in ("bfloat16", "float16") and gpu.head_dim in (64, 128)
    assert gpu.seq >= 1024
    assert demo.default_config("cpu", steps=7).steps == 7


def _hopper_device():
    return (hopper_devices() or [None])[0]


@pytest.mark.gpu
@pytest.mark.skipif(_hopper_device() is None, reason="needs a CUDA GPU of compute capability 9.0")
def test_demo_on_hopper_is_bitwise_reproducible():
    cfg = demo.DemoConfig(steps=5, seq=512, layers=2, heads=4, head_dim=64, batch=4,
                          dtype="bfloat16")
    with jax.default_device(_hopper_device()):
        result = demo.run_demo(cfg)
    assert result.identical, [run.digest for run in result.runs]
    assert result.runs[0].losses == result.runs[1].losses
    assert all(np.isfinite(result.runs[0].losses))


@pytest.mark.gpu
@pytest.mark.skipif(_hopper_device() is None, reason="needs a CUDA GPU of compute capability 9.0")
def test_demo_on_hopper_runs_the_cudnn_contrast():
    out = io.StringIO()
    args = ["--steps", "3", "--seq", "256", "--layers", "1", "--heads", "2", "--head-dim", "64",
            "--batch", "2", "--dtype", "bfloat16", "--quiet"]
    with jax.default_device(_hopper_device()):
        assert demo.main(args, out=out) == 0
    text = out.getvalue()
    assert "(gpu" in text and "contrast" in text and "attention cudnn" in text
    assert text.count("params sha256") == 4  # two jax_dash runs, then two cuDNN runs
    assert "final parameters: IDENTICAL" in text.split("contrast")[0]


def test_demo_checks_its_step_first_and_embeds_with_jax_dash():
    from flax import nnx

    from jax_dash.flax import Embed
    model = demo.build_model(demo.DemoConfig(**TINY), vocab_size=10)
    assert isinstance(model.embed, Embed)
    out = io.StringIO()
    assert demo.main([*TINY_ARGS, "--no-contrast", "--quiet", "--vocab", "300"], out=out) == 0
    text = out.getvalue()
    assert "vocabulary 300" in text
    check = next(line for line in text.splitlines() if line.startswith("check_determinism"))
    assert "no operation that is not reproducible on a GPU" in check
    assert "bitwise identical" in check
    assert text.index("check_determinism") < text.index("run 1:")
    del nnx


def test_demo_check_names_a_gather_embedding(monkeypatch):
    """With nnx.Embed (a gather) in place of jax_dash's, the check names the scatter-add of its
    gradient before training."""
    from flax import nnx

    import jax_dash.flax
    monkeypatch.setattr(jax_dash.flax, "Embed", nnx.Embed, raising=False)
    out = io.StringIO()
    demo.main([*TINY_ARGS, "--no-contrast", "--quiet"], out=out)
    text = out.getvalue()
    assert "not reproducible on a GPU" in text and "scatter-add" in text
    assert "jax_dash.embed" in text  # the fix it suggests


def test_vocab_smaller_than_the_corpus_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        demo.main([*TINY_ARGS, "--vocab", "5"], out=io.StringIO())
    assert "vocab=5 must be at least" in capsys.readouterr().err
