"""benchmarks/kernels.py runs end to end on tiny shapes through the interpreter, so that it
works the first time it meets a GPU; its JSON has every field the notebook and README quote."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from utils import REPO_ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="chapter 6 needs Triton (Linux)"
)


def test_the_kernel_benchmark_runs_on_a_cpu(tmp_path):
    plot = tmp_path / "latency.png"
    done = subprocess.run(
        [sys.executable, "benchmarks/kernels.py", "--device", "cpu", "--interpret", "--quick",
         "--plot", str(plot)],
        cwd=REPO_ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["environment"]["copy_GBps"] > 0
    assert "interpreter" in result["environment"]["mode"]
    for row in result["sampling"]:
        for kernel in ("sample_from_probs", "gumbel", "top_p", "top_k", "softmax"):
            for key in ("kernel_ms", "torch_ms", "speedup", "floor_ms", "x_floor"):
                assert math.isfinite(row[kernel][key]) and row[kernel][key] > 0, (kernel, key)
        assert row["top_p"]["mean_rounds"] >= 1
    assert result["rejection"] and all(r["speedup"] > 0 for r in result["rejection"])
    for row in result["fused"]:
        assert row["x_matmul"] > 0 and row["speedup_vs_torch"] > 0 and row["x_floor"] > 0
    assert set(result["goals"]) == {"top_p_10x", "fused", "from_probs_3x_floor"}
    for goal in result["goals"].values():
        assert goal["passed"] in (None, True, False)
    assert plot.exists() and plot.stat().st_size > 1000
