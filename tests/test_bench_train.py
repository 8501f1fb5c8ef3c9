"""CPU smoke test of benchmarks/bench_train.py: a tiny decoder, < 60 s on 2 cores."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import _train_model  # noqa: E402
import bench_train  # noqa: E402

TINY_MODEL = ["--layers", "1", "--d-model", "256", "--heads", "4", "--kv-heads", "2",
              "--head-dim", "64", "--vocab", "512", "--mlp-hidden", "512"]


def test_flops_follow_maxtext():
    """MaxText's calculate_tflops_training_per_device, written out for the default model."""
    cfg = _train_model.ModelConfig()
    batch, seq = 4, 4096
    tokens = batch * seq
    ffn = 2 * tokens * 5632 * 2048 * 3
    qkv = 2 * tokens * 2048 * (16 + 2 * 8) * 128
    proj = 2 * tokens * 2048 * 16 * 128
    lm_head = 2 * tokens * 2048 * 128256
    attention = 4 * batch * seq ** 2 * 16 * 128 / 2
    flops = _train_model.training_flops(cfg, batch, seq)
    assert flops["weights"] == pytest.approx(3 * (8 * (ffn + qkv + proj) + lm_head), rel=1e-12)
    assert flops["attention"] == pytest.approx(3 * 8 * attention, rel=1e-12)
    assert 0.89e9 < _train_model.param_count(cfg) < 0.92e9  # the ~0.9B the docs promise


def test_batch_rule_and_bad_options():
    assert bench_train.batch_for(4096, 16384) == 4
    assert bench_train.batch_for(32768, 16384) == 1
    assert bench_train.main(["--configs", "cudnn,flash"]) == 2
    assert bench_train.main(["--steps", "3", "--warmup", "3"]) == 2
    with pytest.raises(ValueError, match="heads=6 must be a multiple of kv_heads=4"):
        _train_model.ModelConfig(heads=6, kv_heads=4)


def test_cli_on_cpu(tmp_path):
    import jax_dash
    dash_configs = ["dash_onehot"] + (["dash_embed"] if hasattr(jax_dash, "embed") else [])
    out = tmp_path / "res"
    cmd = [sys.executable, str(BENCH_DIR / "bench_train.py"), *TINY_MODEL, "--seqs", "128",
           "--tokens", "256", "--steps", "3", "--warmup", "1",
           "--configs", ",".join(["cudnn_gather"] + dash_configs), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    rows = data["records"]
    assert rows["cudnn_gather|128"]["status"].startswith("skipped: cuDNN attention needs a CUDA GPU")
    for config in dash_configs:
        row = rows[f"{config}|128"]
        assert row["status"] == "ok", row["status"]
        assert row["batch"] == 2 and len(row["step_times_s"]) == 2
        assert math.isfinite(row["step_time_s"]) and row["step_time_s"] > 0
        assert row["tflops_per_s"] > 0 and row["losses_finite"]
        # Everything is deterministic on a CPU: both checks must pass there.
        assert row["same_process"] is True and row["cross_process"] is True
    assert "| dash_onehot | 128 | 2 |" in (out / "results.md").read_text()
    assert "| dash_onehot | 128 | 2 |" in proc.stdout  # the table is printed last
