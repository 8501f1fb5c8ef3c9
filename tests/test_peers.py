"""The FA3 / tokamax peers of the attention benchmark, on the CPU with a fake flash_attn3_jax.

The fake mirrors what benchmarks/_peers.py relies on in the real wheel: `flash_mha(q, k, v,
is_causal=..., window_size=(left, right))` (-1: no limit), and a `flash_attn3_jax.flash_hlo` module
whose backward goes through its global `jax.ffi.ffi_call("flash_mha_bwd", ...)(...,
deterministic=False)`.
"""

import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import _grid  # noqa: E402
import _peers  # noqa: E402
import _report  # noqa: E402
import _worker  # noqa: E402

from jax_dash.reference import reference_attention  # noqa: E402

POINT = _grid.Point(head_dim=128, seq=64, mask="causal", batch=2, heads=2)


def make_fake_fa3(*, wrong_grads=False):
    """A pure-JAX flash_attn3_jax: (package, flash_hlo, calls) with calls recording the bwd attrs."""
    calls = {"fwd": 0, "bwd_attrs": []}

    def fake_ffi_call(target_name, *args, **kwargs):
        assert target_name == "flash_mha_bwd"

        def call(dout, q, k, v, *, is_causal, deterministic, window=None, **attrs):
            calls["bwd_attrs"].append({"deterministic": deterministic, **attrs})
            _, vjp = jax.vjp(lambda q, k, v: reference_attention(
                q, k, v, is_causal=is_causal, compute_dtype=jnp.float32,
                local_window_size=window), q, k, v)
            dq, dk, dv = (g.astype(q.dtype) for g in vjp(dout.astype(jnp.float32)))
            if wrong_grads:  # what a broken backward looks like: dq off by a lot
                dq = dq * 3 + 1
            return dq, dk, dv

        return call

    flash_hlo = types.ModuleType("flash_attn3_jax.flash_hlo")
    flash_hlo.jax = types.SimpleNamespace(ffi=types.SimpleNamespace(ffi_call=fake_ffi_call),
                                          numpy=jnp)

    def _bwd(res, dout):
        q, k, v, is_causal, window = res
        # As the real binding: the backward looks `jax` up in flash_hlo's globals.
        dq, dk, dv = flash_hlo.jax.ffi.ffi_call("flash_mha_bwd", None)(
            dout, q, k, v, is_causal=is_causal, deterministic=False, softcap=0.0, window=window)
        return dq, dk, dv, None

    def flash_mha(q, k, v, softmax_scale=None, is_causal=False, window_size=(-1, -1)):
        calls["fwd"] += 1
        calls.setdefault("window_sizes", []).append(tuple(window_size))
        window = None if tuple(window_size) == (-1, -1) else tuple(window_size)
        return _attention(q, k, v, is_causal, window)

    def _attention(q, k, v, is_causal, window):
        f = jax.custom_vjp(lambda q, k, v: reference_attention(
            q, k, v, is_causal=is_causal, local_window_size=window).astype(q.dtype))
        f.defvjp(lambda q, k, v: (f(q, k, v), (q, k, v)),
                 lambda res, dout: _bwd((*res, is_causal, window), dout)[:3])
        return f(q, k, v)

    package = types.ModuleType("flash_attn3_jax")
    package.__version__ = "0.2.3-fake"
    package.flash_mha = flash_mha
    package.flash_hlo = flash_hlo
    return package, flash_hlo, calls


@pytest.fixture
def fake_fa3(monkeypatch):
    """Installs a fake flash_attn3_jax; returns a function(wrong_grads) -> (flash_hlo, calls)."""
    monkeypatch.setattr(_peers, "_backend", lambda: "gpu")  # pretend: the fake runs on the CPU
    monkeypatch.setitem(_peers.FA3_PATCH, "installed", False)
    monkeypatch.setitem(_peers.FA3_PATCH, "bwd_lowerings", 0)

    def install(wrong_grads=False):
        package, flash_hlo, calls = make_fake_fa3(wrong_grads=wrong_grads)
        monkeypatch.setitem(sys.modules, "flash_attn3_jax", package)
        monkeypatch.setitem(sys.modules, "flash_attn3_jax.flash_hlo", flash_hlo)
        return flash_hlo, calls

    return install


def time_item(impl, point=POINT):
    return {"kind": "time", "impl": impl, "schedule": None, "point": point.to_json(), "iters": 2,
            "num_sets": 2, "repeats": 2, "time_budget_s": 0.5}


def run_worker_item(item):
    """The worker's per-item handling (worker_main's try/except), without a subprocess."""
    record = {"item": item, "skipped": None, "error": None, "result": None}
    try:
        record["result"] = _worker.run_item(item)
    except _peers.Unavailable as e:
        record["skipped"] = str(e)
    except _peers.Wrong as e:
        record["wrong"] = str(e)
        record["check"] = e.check
    return record


def test_new_peers_are_in_the_grid():
    for impl in ("fa3", "fa3_det", "tokamax"):
        assert impl in _grid.IMPLS and impl in _peers.CHECKED_IMPLS
    assert _peers.worker_group("fa3") == "default"
    assert _peers.worker_group("fa3_det") == "fa3_det"
    assert _peers.worker_group("cudnn_det") == "det"


def test_correct_fa3_is_called_checked_and_timed(fake_fa3, monkeypatch):
    monkeypatch.delenv(_peers.FA3_DETERMINISTIC_ENV, raising=False)
    flash_hlo, calls = fake_fa3()
    record = run_worker_item(time_item("fa3"))
    assert record["skipped"] is None and "wrong" not in record, record
    result = record["result"]
    assert calls["fwd"] > 0 and calls["bwd_attrs"]  # the harness went through flash_mha
    assert all(a["deterministic"] is False for a in calls["bwd_attrs"])  # fa3: unpatched
    assert result["check"]["ok"] and set(result["check"]["tensors"]) == set(_peers.TENSORS)
    assert result["fwd"]["median_s"] > 0 and result["bwd_s"] > 0


def test_fa3_det_forces_the_deterministic_attribute(fake_fa3, monkeypatch):
    monkeypatch.setenv(_peers.FA3_DETERMINISTIC_ENV, "1")
    flash_hlo, calls = fake_fa3()
    original = flash_hlo.jax
    record = run_worker_item(time_item("fa3_det"))
    assert record["skipped"] is None and "wrong" not in record, record
    assert calls["bwd_attrs"] and all(a["deterministic"] is True for a in calls["bwd_attrs"])
    assert all(a["softcap"] == 0.0 for a in calls["bwd_attrs"])  # other attributes untouched
    assert record["result"]["fa3_deterministic_patch"]["bwd_lowerings"] >= 1
    # Only flash_hlo's global `jax` is replaced, by a proxy forwarding to the original.
    assert isinstance(flash_hlo.jax, _peers._JaxForcingDeterministicBwd)
    assert flash_hlo.jax.numpy is original.numpy
    _peers.patch_fa3_deterministic(flash_hlo)  # idempotent: no proxy of a proxy
    assert flash_hlo.jax._jax is original


def test_patch_fails_loudly_if_the_binding_changed(fake_fa3):
    flash_hlo, _ = fake_fa3()
    _peers.patch_fa3_deterministic(flash_hlo)
    call = flash_hlo.jax.ffi.ffi_call("flash_mha_bwd", None)
    with pytest.raises(RuntimeError, match="binding changed"):
        call(None, None, None, None, is_causal=True)  # no deterministic=False passed


def test_fa3_and_fa3_det_are_split_by_process(fake_fa3, monkeypatch):
    fake_fa3()
    monkeypatch.delenv(_peers.FA3_DETERMINISTIC_ENV, raising=False)
    with pytest.raises(_peers.Unavailable, match=_peers.FA3_DETERMINISTIC_ENV):
        _peers.attention_fn("fa3_det", is_causal=True, head_dim=128)
    monkeypatch.setenv(_peers.FA3_DETERMINISTIC_ENV, "1")
    with pytest.raises(_peers.Unavailable, match=_peers.FA3_DETERMINISTIC_ENV):
        _peers.attention_fn("fa3", is_causal=True, head_dim=128)


def test_wrong_gradients_are_reported_wrong_and_not_timed(fake_fa3, monkeypatch):
    monkeypatch.delenv(_peers.FA3_DETERMINISTIC_ENV, raising=False)
    fake_fa3(wrong_grads=True)
    timed = []
    monkeypatch.setattr(_worker._timing, "time_function",
                        lambda *a, **k: timed.append(a) or {"median_s": 1.0})
    record = run_worker_item(time_item("fa3"))
    assert record["result"] is None and record["error"] is None and not timed
    assert record["wrong"].startswith("wrong against the reference") and "dq" in record["wrong"]
    tensors = record["check"]["tensors"]
    assert not tensors["dq"]["ok"] and tensors["dq"]["max_error"] > tensors["dq"]["budget"]
    assert tensors["out"]["ok"] and tensors["dk"]["ok"] and tensors["dv"]["ok"]
    # The report lists it as wrong, with its error, and it has no timing.
    res = _report.Results({"records": {"time|fa3|-|x": record}})
    assert not res.timing
    assert any("WRONG (not timed)" in msg and "dq" in msg for _, msg in res.problems)
    assert "WRONG" in _worker.progress_line(record["item"], record)


def test_check_passes_a_correct_peer_with_gqa():
    q, k, v, dout = (jax.random.normal(jax.random.key(i), s, jnp.bfloat16) for i, s in
                     enumerate([(2, 32, 4, 64), (2, 32, 2, 64), (2, 32, 2, 64), (2, 32, 4, 64)]))
    fn = lambda q, k, v: reference_attention(q, k, v, is_causal=False).astype(q.dtype)
    check = _peers.check_against_reference(fn, q, k, v, dout, is_causal=False)
    assert check["ok"] and check["slice"] == {"batch": 1, "heads": 2, "kv_heads": 1}


def test_unavailable_peers_give_a_reason(fake_fa3, monkeypatch):
    monkeypatch.delenv(_peers.FA3_DETERMINISTIC_ENV, raising=False)
    # Not installed.
    monkeypatch.setitem(sys.modules, "flash_attn3_jax", None)
    record = run_worker_item(time_item("fa3"))
    assert record["error"] is None and "not installed" in record["skipped"]
    # Installed, but head_dim 64 has no kernel in the wheel.
    fake_fa3()
    point = _grid.Point(head_dim=64, seq=64, mask="full", batch=1, heads=2)
    record = run_worker_item(time_item("fa3", point))
    assert record["error"] is None and "head_dim" in record["skipped"] and "64" in record["skipped"]
    # Installed, but no GPU.
    monkeypatch.setattr(_peers, "_backend", lambda: "cpu")
    record = run_worker_item(time_item("fa3"))
    assert record["error"] is None and "needs a CUDA GPU" in record["skipped"]
    # tokamax: either not importable here, or importable (xprof stubbed) but needing a GPU.
    record = run_worker_item(time_item("tokamax"))
    assert record["error"] is None and record["skipped"]
    assert "tokamax" in record["skipped"] or "GPU" in record["skipped"]


def test_xprof_stub_is_only_installed_where_xprof_is_absent(monkeypatch):
    for name in ("xprof", "xprof.cli", "xprof.cli.tools"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(_peers.importlib.util, "find_spec", lambda name: None)
    assert _peers._install_xprof_stub() is True
    from xprof.cli.tools import get_kernel_stats_tool
    with pytest.raises(RuntimeError, match="stub"):
        get_kernel_stats_tool()
    assert _peers._install_xprof_stub() is False  # already there: left alone


# ---- the window benchmark (bench_masks.py) with the peers -------------------------------------

MASK_ARGS = ["--seq", "256", "--window", "64", "--doc-mean", "40", "--tokens", "256", "--hidden",
             "256", "--head-dim", "128", "--dtype", "float32", "--iters", "1"]


def _mask_records(tmp_path, impls):
    import json

    import bench_masks
    out = tmp_path / "masks.json"
    assert bench_masks.main(MASK_ARGS + ["--impls", impls, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_window_point_checks_and_times_fa3_with_its_window(fake_fa3, monkeypatch, tmp_path):
    """FA3 at the window point gets window_size=(63, 0) (jax.nn's local_window_size), is checked
    against the windowed reference, then timed; it does not run the packed point."""
    monkeypatch.delenv(_peers.FA3_DETERMINISTIC_ENV, raising=False)
    _, calls = fake_fa3()
    records = {(r["name"], r["impl"]): r for r in _mask_records(tmp_path, "jax_dash,fa3")}
    window = records[("sliding_window_64", "fa3")]
    assert window["status"] == "ok" and window["check"]["ok"] and window["bwd_tflops"] > 0
    assert (63, 0) in calls["window_sizes"] and (-1, -1) in calls["window_sizes"]
    assert records[("causal", "fa3")]["check"]["ok"]
    assert ("packed_mean_40", "fa3") not in records
    assert records[("sliding_window_64", "jax_dash")]["check"]["ok"]


def test_window_point_reports_a_wrong_peer_without_timing_it(fake_fa3, monkeypatch, tmp_path):
    monkeypatch.delenv(_peers.FA3_DETERMINISTIC_ENV, raising=False)
    fake_fa3(wrong_grads=True)
    records = {(r["name"], r["impl"]): r for r in _mask_records(tmp_path, "fa3")}
    window = records[("sliding_window_64", "fa3")]
    assert window["status"] == "wrong" and "dq" in window["error"] and "bwd_tflops" not in window
    assert not window["check"]["tensors"]["dq"]["ok"]


def test_window_reference_differs_from_causal():
    """The check really applies the window: a causal-only function fails at the window point."""
    import bench_masks
    point = [p for p in bench_masks.mask_points(256, 64, 40, 256, 256, 128)
             if p["name"] == "sliding_window_64"][0]
    shape = (1, 256, 2, 128)
    q, k, v, dout = (jax.random.normal(jax.random.key(i), shape, jnp.float32) for i in range(4))
    causal_only = _peers.attention_fn("xla", is_causal=True)
    with pytest.raises(_peers.Wrong):
        _peers.check_against_reference(causal_only, q, k, v, dout, is_causal=True,
                                       window=point["kwargs"]["local_window_size"])
    windowed = _peers.attention_fn("xla", is_causal=True, window=(63, 0))
    assert _peers.check_against_reference(windowed, q, k, v, dout, is_causal=True,
                                          window=(63, 0))["ok"]


# ---- the Triton tutorial (a PyTorch peer; its timing path runs on a GPU only) ------------------

def test_triton_tutorial_is_skipped_with_the_reason(monkeypatch, tmp_path):
    import _triton_tutorial
    fp16 = _grid.Point(head_dim=64, seq=256, mask="causal", batch=1, heads=2, dtype="float16")
    monkeypatch.delenv(_triton_tutorial.TUTORIAL_ENV, raising=False)
    record = run_worker_item(time_item("triton_tutorial", fp16))
    assert record["error"] is None and "--triton-tutorial PATH" in record["skipped"]
    # What the tutorial's kernels cannot take is said before anything is imported.
    for point, words in ((POINT, "float16 only"),
                         (_grid.Point(head_dim=64, seq=200, mask="full", batch=1, heads=2,
                                      dtype="float16"), "seq % 128"),
                         (_grid.Point(head_dim=64, seq=256, mask="full", batch=1, heads=4,
                                      kv_heads=2, dtype="float16"), "GQA")):
        record = run_worker_item(time_item("triton_tutorial", point))
        assert record["error"] is None and words in record["skipped"], record
    monkeypatch.setenv(_triton_tutorial.TUTORIAL_ENV, str(tmp_path / "missing.py"))
    assert "is not a file" in run_worker_item(time_item("triton_tutorial", fp16))["skipped"]
    tutorial = tmp_path / "06-fused-attention.py"
    tutorial.write_text("attention = None\n")
    monkeypatch.setenv(_triton_tutorial.TUTORIAL_ENV, str(tutorial))
    skipped = run_worker_item(time_item("triton_tutorial", fp16))["skipped"]
    assert any(s in skipped for s in ("needs PyTorch and Triton", "needs a CUDA GPU",
                                      "defines no attention")), skipped
    # It is not a JAX function: asking for one says so.
    with pytest.raises(_peers.Unavailable, match="PyTorch"):
        _peers.attention_fn("triton_tutorial", is_causal=True)


def test_check_outputs_takes_numpy_outputs_of_a_torch_peer():
    """The tutorial's outputs come back as numpy [B, S, H, D] float32 (exact from float16)."""
    import numpy as np
    q, k, v, dout = (np.asarray(jax.random.normal(jax.random.key(i), (1, 128, 2, 64),
                                                  jnp.float16)) for i in range(4))
    out, vjp = jax.vjp(lambda q, k, v: reference_attention(q, k, v, is_causal=True,
                                                           compute_dtype=jnp.float32), q, k, v)
    dout = dout.astype(np.float32)
    got = [np.asarray(x, np.float32) for x in (out, *vjp(dout))]
    dout = dout.astype(np.float16)
    assert _peers.check_outputs(got, q, k, v, dout, is_causal=True)["ok"]
    got[1] = got[1] * 2  # a wrong dq
    with pytest.raises(_peers.Wrong, match="dq"):
        _peers.check_outputs(got, q, k, v, dout, is_causal=True)


def test_float16_points_have_their_own_keys():
    bf16 = _grid.Point(head_dim=64, seq=256, mask="causal", batch=1, heads=2)
    assert bf16.key == "hd64-causal-s256-b1-h2"  # keys of results.json files written before
    fp16 = _grid.Point.from_json(dict(bf16.to_json(), dtype="float16"))
    assert fp16.key == "hd64-causal-s256-b1-h2-float16" and "float16" in fp16.label()
    assert _grid.Point.from_json({k: v for k, v in bf16.to_json().items() if k != "dtype"}) == bf16
    with pytest.raises(ValueError, match="dtype"):
        _grid.Point(head_dim=64, seq=256, mask="causal", batch=1, heads=2, dtype="float32")
    assert {p.dtype for p in _grid.make_grid([64], [256], ["causal"], tokens=512, hidden=128,
                                             dtype="float16")} == {"float16"}
    (args,) = _peers.random_inputs(fp16, num_sets=1)
    assert all(x.dtype == jnp.float16 for x in args)


def test_bench_attention_options_for_the_tutorial(tmp_path):
    import bench_attention
    parse = lambda *a: bench_attention.Options(bench_attention.build_parser().parse_args(list(a)))
    with pytest.raises(ValueError, match="--triton-tutorial"):
        parse("--triton-tutorial", str(tmp_path / "missing.py"))
    tutorial = tmp_path / "t.py"
    tutorial.write_text("")
    opts = parse("--triton-tutorial", str(tutorial), "--dtype", "float16", "--seqs", "1k",
                 "--head-dims", "64")
    assert opts.triton_tutorial == str(tutorial.resolve())
    assert {p.dtype for p in opts.points} == {"float16"}
    with pytest.raises(SystemExit):
        parse("--dtype", "float32")
