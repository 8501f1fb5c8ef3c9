"""CPU smoke tests of the benchmark harness (benchmarks/): tiny sizes, < 60 s on 2 cores."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import _grid  # noqa: E402
import _numerics  # noqa: E402
import _peers  # noqa: E402
import _report  # noqa: E402
import _timing  # noqa: E402
import _worker  # noqa: E402
import bench_attention  # noqa: E402


def test_schedule_lists_match_the_package(monkeypatch):
    """_grid spells the schedules out (its parent process imports no jax_dash): they must be
    jax_dash's. bwd_schedules_sm90 imports jax_dash and derives them."""
    import importlib.util

    import jax_dash
    from jax_dash import _ffi

    assert _grid.SCHEDULES == jax_dash.SCHEDULES
    assert _grid.DETERMINISTIC_SCHEDULES == tuple(s for s in jax_dash.SCHEDULES if s != "atomic")
    monkeypatch.setitem(_ffi.SCHEDULE_IDS, "new", len(_ffi.SCHEDULE_IDS))
    spec = importlib.util.spec_from_file_location("_fresh_bwd_schedules_sm90",
                                                  BENCH_DIR / "bwd_schedules_sm90.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SCHEDULES == tuple(_ffi.SCHEDULE_IDS)
    assert module.SCHEDULES[-1] == "new"


def test_flops_follow_the_paper_convention():
    p = _grid.Point(head_dim=128, seq=4096, mask="full", batch=4, heads=16)
    assert _grid.forward_flops(p) == 4 * 4 * 16 * 4096 * 4096 * 128
    causal = _grid.Point(head_dim=128, seq=4096, mask="causal", batch=4, heads=16)
    assert _grid.forward_flops(causal) == _grid.forward_flops(p) / 2
    assert _grid.backward_flops(causal) == 2.5 * _grid.forward_flops(causal)


def test_paper_grid_keeps_tokens_and_hidden_fixed():
    grid = _grid.make_grid((64, 128), _grid.PAPER_SEQS, _grid.MASKS)
    assert len(grid) == 2 * 6 * 2
    for p in grid:
        assert p.batch * p.seq == 16384 and p.heads * p.head_dim == 2048


def test_bad_options_name_the_option_and_value():
    with pytest.raises(ValueError, match=r"seq=100 must divide tokens=16384"):
        _grid.make_grid((64,), (100,), ("full",))
    with pytest.raises(ValueError, match=r"--seqs='5x'"):
        _grid.parse_int_list("5x", name="--seqs")
    with pytest.raises(ValueError, match=r"--impls=.*'flash'.*allowed"):
        _grid.parse_choice_list("cudnn,flash", name="--impls", allowed=_grid.IMPLS)
    assert _grid.parse_int_list("512,1k,16k", name="--seqs") == (512, 1024, 16384)
    assert bench_attention.main(["--seqs", "100"]) == 2
    assert bench_attention.main(["--skip-timing"]) == 2


def test_time_function_rotates_inputs_and_reports_median():
    import jax.numpy as jnp
    seen = []

    def fn(x):
        seen.append(int(x[0]))
        return x + 1

    sets = [(jnp.zeros(4),), (jnp.ones(4),)]
    result = _timing.time_function(fn, sets, iters=3)
    assert result["samples"] == 3 and result["median_s"] > 0
    assert result["min_s"] <= result["median_s"] <= result["max_s"]
    assert {0, 1} <= set(seen[2:])  # timed calls use both input sets, not one
    # A sample is a run of calls of >= MIN_SAMPLE_S (capped at MAX_CALLS_PER_SAMPLE calls): a
    # call far below 10 ms is timed several to a sample; the record says the minimum it used.
    assert result["min_sample_s"] == _timing.MIN_SAMPLE_S == 20e-3
    assert 2 <= result["calls_per_sample"] <= _timing.MAX_CALLS_PER_SAMPLE


def test_bitwise_repeatable_detects_changing_bits():
    import jax.numpy as jnp
    calls = []

    def drifting(x):
        calls.append(1)
        return (x * (1 + 1e-6 * len(calls)),)

    x = jnp.linspace(1, 2, 8, dtype=jnp.float32)
    assert not _timing.bitwise_repeatable(drifting, (x,))["repeatable"]
    assert _timing.bitwise_repeatable(lambda x: (x * 2, x + 1), (x,))["repeatable"]


def test_fp64_reference_matches_softmax_definition():
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 5, 1, 3)) for _ in range(4))
    out, dq, dk, dv = _numerics.reference_fp64(q, k, v, do, is_causal=True)
    # Causal row 0 sees only key 0: its output is v[0] and its query gradient is zero.
    np.testing.assert_allclose(out[0, 0, 0], v[0, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(dq[0, 0, 0], 0.0, atol=1e-12)
    # Gradient of sum(out * do) w.r.t. v by finite differences.
    eps = 1e-6
    v2 = v.copy()
    v2[0, 2, 0, 1] += eps
    out2 = _numerics.reference_fp64(q, k, v2, do, is_causal=True)[0]
    numeric = ((out2 - out) * do).sum() / eps
    np.testing.assert_allclose(dv[0, 2, 0, 1], numeric, rtol=1e-5)


@pytest.mark.usefixtures("on_cpu")
@pytest.mark.parametrize("impl", ["jax_dash", "xla"])
def test_backward_alone_runs_only_the_backward(impl):
    import jax
    import jax.numpy as jnp

    point = _grid.Point(head_dim=32, seq=64, mask="causal", batch=1, heads=2)
    (args,) = _peers.random_inputs(point, num_sets=1, dtype_name="float32")
    fn = _peers.attention_fn(impl, is_causal=True)
    residuals, backward = _peers.jitted_backward(fn)
    _, fwd_bwd = _peers.jitted_pair(fn)
    vjp_fn = residuals(*args[:3])
    grads = backward(vjp_fn, args[3])
    for got, want in zip(grads, fwd_bwd(*args)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    hlo = backward.lower(vjp_fn, args[3]).as_text()
    if impl == "jax_dash":  # the forward kernel is not in the timed program, the backward is
        assert "jax_dash_bwd" in hlo and "jax_dash_fwd" not in hlo
        assert "jax_dash_fwd" in fwd_bwd.lower(*args).as_text()
    else:  # XLA's backward reuses the saved probabilities: no exponentials recomputed
        assert "exponential" not in hlo
        assert "exponential" in jax.jit(fn).lower(*args[:3]).as_text()
    assert all(x.dtype == jnp.float32 for x in grads)


def test_benchmark_imports_run_one_way():
    """No import cycle among benchmarks/*.py, counting imports inside functions too."""
    import ast

    local = {f.stem for f in BENCH_DIR.glob("*.py")}
    graph = {}
    for name in local:
        tree = ast.parse((BENCH_DIR / f"{name}.py").read_text())
        graph[name] = {alias.name.split(".")[0] for node in ast.walk(tree)
                       if isinstance(node, ast.Import) for alias in node.names} & local
        graph[name] |= {node.module.split(".")[0] for node in ast.walk(tree)
                        if isinstance(node, ast.ImportFrom) and node.module} & local
    assert graph["bench_memory"] == {"bench_attention"}  # the entry points sit on top

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, seen + (n,)))
                   for n in graph[start])

    cycles = [name for name in local if reaches(name, name)]
    assert not cycles, {name: graph[name] for name in cycles}


def test_cli_help_runs():
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "bench_attention.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--memory" in proc.stdout and "--numerics" in proc.stdout


def _fake_record(impl, schedule, point, fwd_s, bwd_s, repeatable=True):
    item = {"kind": "time", "impl": impl, "schedule": schedule, "point": point.to_json()}
    f = _grid.forward_flops(point)
    return {"item": item, "skipped": None, "error": None, "result": {
        "fwd": {"median_s": fwd_s}, "fwd_bwd": {"median_s": fwd_s + bwd_s}, "bwd_s": bwd_s,
        "tflops": {"fwd": f / fwd_s / 1e12, "bwd": 2.5 * f / bwd_s / 1e12,
                   "fwd_bwd": 3.5 * f / (fwd_s + bwd_s) / 1e12},
        "repeat": {"repeatable": repeatable}}}


def test_report_ratios_and_tax():
    p = _grid.Point(head_dim=128, seq=4096, mask="causal", batch=4, heads=16)
    records = [
        _fake_record("cudnn", None, p, 1.0, 2.0, repeatable=False),
        _fake_record("cudnn_det", None, p, 1.0, 3.0),
        _fake_record("jax_dash", "auto", p, 1.0, 1.5),
        _fake_record("jax_dash", "atomic", p, 1.0, 1.2, repeatable=False),
    ]
    data = {"records": {bench_attention.record_key(r["item"]): r for r in records},
            "runs": [{"command": "x"}]}
    res = _report.Results(data)
    assert res.ratio(p, "jax_dash:auto", "cudnn") == pytest.approx(2.0 / 1.5)
    assert res.ratio(p, "jax_dash:auto", "cudnn_det") == pytest.approx(2.0)
    assert res.tax(p, "jax_dash:auto") == pytest.approx(0.25)
    md = _report.render_markdown(data)
    assert "| auto / cuDNN det | 2.00x |" in md
    assert "+25.0%" in md and "cuDNN, dash atomic" in md
    assert "| 1. auto bwd >= 1.0x cuDNN (seq >= 2k) | met (1/1 points) | 1.33x" in md
    assert "| 3. tax vs atomic <= 5% (seq >= 2k) | NOT met (0/1 points) | +25.0%" in md
    assert "| 4. forward >= 0.95x cuDNN | met (1/1 points) | 1.00x" in md
    # Records without min_sample_s were taken at the old 2 ms minimum; the method line says so.
    assert "(>= 2 ms per sample)" in md


def test_dying_worker_costs_one_item(tmp_path):
    records = []
    items = [{"kind": "selftest_exit", "code": 7}, {"kind": "env", "group": "default"}]
    _worker.run_items(items, script=str(BENCH_DIR / "bench_attention.py"), env=None,
                      item_timeout_s=120, on_record=records.append)
    assert len(records) == 2
    assert "exited with code 7" in records[0]["error"]
    assert records[1]["error"] is None and records[1]["result"]["platform"] == "cpu"


def test_cli_smoke_on_cpu(tmp_path):
    out = tmp_path / "res"
    cmd = [sys.executable, str(BENCH_DIR / "bench_attention.py"), "--tokens", "128", "--hidden", "128",
           "--head-dims", "64", "--seqs", "64", "--schedules", "auto,atomic",
           "--iters", "2", "--peak-size", "64", "--numerics", "--numerics-seqs", "32",
           "--masks", "causal", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cuDNN attention needs a CUDA GPU" in proc.stderr  # the skip note is printed
    data = json.loads((out / "results.json").read_text())
    records = data["records"]
    assert records["env|default"]["result"]["platform"] == "cpu"
    assert records["peak"]["result"]["tflops"] > 0
    point = _grid.Point(head_dim=64, seq=64, mask="causal", batch=2, heads=2)
    xla = records[f"time|xla|-|{point.key}"]["result"]
    assert xla["fwd"]["median_s"] > 0 and xla["fwd_bwd"]["median_s"] > 0
    # The backward is timed alone (a VJP of precomputed residuals), not as a difference.
    assert xla["bwd_s"] == xla["bwd"]["median_s"] > 0 and xla["bwd_method"] == _worker.BWD_METHOD
    assert xla["bwd"]["input_sets"] == 2  # tiny residuals: both input sets rotate
    assert xla["repeat"]["repeatable"] is True
    assert records[f"time|cudnn|-|{point.key}"]["skipped"]
    assert records[f"time|cudnn_det|-|{point.key}"]["skipped"]
    dash = records[f"time|jax_dash|auto|{point.key}"]
    if dash["skipped"] is None:  # jax_dash importable: its deterministic schedule must repeat
        assert dash["error"] is None, dash["error"]
        assert dash["result"]["repeat"]["repeatable"] is True
    numerics = records[f"numerics|{_grid.Point(head_dim=64, seq=32, mask='causal', batch=1, heads=2).key}"]
    xla_dev = numerics["result"]["impls"]["xla"]
    # bf16 attention is accurate to ~1e-2 relative; a broken harness gives O(1) or NaN.
    assert all(0 < xla_dev[t]["rel_rms"] < 5e-2 for t in _numerics.TENSORS)
    md = (out / "results.md").read_text()
    assert "## Backward TFLOP/s" in md and "| 64 | causal | 64 |" in md
    assert "residuals precomputed by a jitted forward" in md
    assert "(>= 20 ms per sample)" in md
    try:
        import matplotlib  # noqa: F401
        assert (out / "bwd_tflops.png").stat().st_size > 0
        assert (out / "numerics.png").stat().st_size > 0
    except ImportError:
        assert "matplotlib is not importable" in proc.stderr


def test_worker_restarts_after_device_fault():
    records = []
    items = [{"kind": "env", "group": "a"}, {"kind": "selftest_fault"}, {"kind": "env", "group": "b"},
             {"kind": "no_such_kind"}, {"kind": "env", "group": "c"}]
    _worker.run_items(items, script=str(BENCH_DIR / "bench_attention.py"), env=None,
                      item_timeout_s=120, on_record=records.append)
    assert [r["item"]["kind"] for r in records] == [r["kind"] for r in items]
    assert "simulated device fault" in records[1]["error"]
    assert "no_such_kind" in records[3]["error"]
    pids = [records[i]["result"]["worker_pid"] for i in (0, 2, 4)]
    # A fault that breaks the device restarts the worker; an ordinary error does not.
    assert pids[0] != pids[1] and pids[1] == pids[2]


def test_memory_report_flags_ooms_when_others_held_memory():
    import _memory
    p16, p32 = (_grid.Point(head_dim=128, seq=s, mask="causal", batch=1, heads=16) for s in (16384, 32768))

    def mem(impl, point, peak, oom=False, held=300):
        item = {"kind": "memory", "impl": impl, "schedule": "auto" if impl == "jax_dash" else None,
                "point": point.to_json(), "gpu_memory_used_before_mib": held}
        return {"item": item, "skipped": None, "error": None, "result": {
            "inputs_bytes": 10**9, "peak_bytes": peak, "oom": oom, "temp_bytes": 3 * 10**10 if oom else 1,
            "gpu_memory_used_before_mib": held}}

    records = [mem("cudnn", p16, 6.7e8), mem("jax_dash", p16, 6.7e8), mem("cudnn_det", p16, 9.1e9),
               mem("cudnn", p32, 1.35e9), mem("jax_dash", p32, 4e9),
               mem("cudnn_det", p32, None, oom=True, held=_memory.OTHERS_MEMORY_WARN_MIB + 60000)]
    md = _report.render_markdown({"records": {bench_attention.record_key(r["item"]): r for r in records}})
    assert "OOM, plans 30.0 GB temp (SUSPECT: other processes held 59.6 GiB at start)" in md
    assert "| 16384 | 1x16x128 causal | 0.67 | 9.10 | 0.67 | 1.00x |" in md
    # Goal 5 (<= 2x cuDNN's peak) fails at 32k where jax_dash needs 4 / 1.35 GB.
    assert "| 5. fwd+bwd peak memory <= 2x cuDNN | NOT met (1/2 points) | 2.96x" in md


def test_mask_points_count_visible_work_exactly():
    """bench_masks's closed-form pair counts equal the dense mask's (jax_dash.reference)."""
    import bench_masks
    from jax_dash.reference import visible_mask

    for seq_q, seq_kv, causal, window in ((100, 100, True, (31, 0)), (90, 120, False, (7, 13)),
                                          (64, 64, True, None), (50, 70, False, None)):
        dense = visible_mask(seq_q, seq_kv, is_causal=causal, local_window_size=window)
        assert bench_masks.band_visible_pairs(seq_q, seq_kv, is_causal=causal,
                                              window=window) == int(dense.sum())
    docs = bench_masks.random_document_lengths(500, 60, seed=3)
    assert docs.sum() == 500 and (docs >= 1).all()
    ids = bench_masks.segment_ids(docs)[None]
    for causal in (True, False):
        dense = visible_mask(500, 500, is_causal=causal, query_segment_ids=ids,
                             key_value_segment_ids=ids)
        assert bench_masks.packed_visible_pairs(docs, is_causal=causal) == int(dense.sum())


def test_mask_points_run_on_cpu(tmp_path):
    """The sliding-window and packed points, tiny, end to end (float32 on the CPU kernels)."""
    import bench_masks

    out = tmp_path / "masks.json"
    assert bench_masks.main(["--seq", "256", "--window", "64", "--doc-mean", "40", "--tokens",
                             "256", "--hidden", "64", "--head-dim", "32", "--dtype", "float32",
                             "--iters", "1", "--packed-schedules", "descending",
                             "--out", str(out)]) == 0
    records = {r["name"]: r for r in json.loads(out.read_text())}
    assert set(records) == {"causal", "sliding_window_64", "packed_mean_40",
                            "packed_mean_40_descending"}
    assert (records["packed_mean_40_descending"]["visible_pairs_per_row_head"]
            == records["packed_mean_40"]["visible_pairs_per_row_head"])
    with pytest.raises(SystemExit, match="--packed-schedules: 'sideways'"):
        bench_masks.main(["--seq", "256", "--packed-schedules", "sideways"])
    window = records["sliding_window_64"]
    assert window["visible_pairs_per_row_head"] == 64 * 65 // 2 + (256 - 64) * 64
    assert records["causal"]["visible_pairs_per_row_head"] == 256 * 257 // 2
    for r in records.values():
        assert r["fwd_tflops"] > 0 and r["bwd_tflops"] > 0 and r["heads"] == 2


def test_plots_of_merged_runs_skip_the_empty_panels(tmp_path):
    """Runs merged into one results.json (bench_attention --out DIR, run twice) need not fill the
    head_dim x mask grid: the plot leaves such a panel empty (it raised IndexError)."""
    pytest.importorskip("matplotlib")
    path = Path(__file__).resolve().parents[1] / "benchmarks/results/2026-11-26-h200-peers/results.json"
    data = json.loads(path.read_text())
    data["records"] = {k: r for k, r in data["records"].items()
                       if not (r["item"].get("point") or {}).get("head_dim") == 128
                       or r["item"]["point"]["mask"] == "causal"}
    assert any((r["item"].get("point") or {}).get("head_dim") == 64 for r in data["records"].values())
    written = _report.write_plots(data, tmp_path)
    assert set(written) >= {"bwd_tflops.png", "fwd_tflops.png"}
    assert all((tmp_path / name).stat().st_size > 0 for name in written)


def test_dropout_benchmark_smoke_on_cpu(tmp_path):
    """bench_dropout.py on a tiny point on the CPU: jax_dash with and without dropout timed,
    cuDNN's attention (in a child process) recorded as an error (no GPU), and the table's ratio
    is none / dropout."""
    import bench_dropout

    assert bench_dropout.main(["--out", str(tmp_path), "--head-dims", "16", "--seqs", "32",
                               "--masks", "causal", "--tokens", "64", "--hidden", "32",
                               "--iters", "2", "--budget", "0.2"]) == 0
    records = json.loads((tmp_path / "dropout.json").read_text())
    by = {r["impl"]: r for r in records}
    assert by["jax_dash"]["rate"] == 0.0 and by["jax_dash_dropout"]["rate"] == 0.1
    for impl in ("jax_dash", "jax_dash_dropout"):
        assert by[impl]["fwd_ms"] > 0 and by[impl]["bwd_ms"] > 0, by[impl]
    assert "error" in by["cudnn_dropout"]
    ratio = by["jax_dash"]["bwd_ms"] / by["jax_dash_dropout"]["bwd_ms"]
    assert f"{ratio:.3f}" in (tmp_path / "dropout.md").read_text()
    with pytest.raises(SystemExit):
        bench_dropout.main(["--out", str(tmp_path), "--rate", "1.0"])
