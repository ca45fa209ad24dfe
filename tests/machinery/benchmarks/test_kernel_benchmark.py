"""benchmarks/kernels.py runs end to end on tiny shapes through the interpreter, so that it
works the first time it meets a GPU; its JSON has every field the notebook and README quote.
(Triton is looked up, not imported: this process must not import it before TRITON_INTERPRET is
set, and the benchmark runs in a child anyway.)"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.support import needs_triton
from utils import REPO_ROOT
from utils.timing import patient

pytestmark = needs_triton

KERNELS = ("sample_from_probs", "gumbel", "top_p", "top_k", "softmax")
TIMED = ("kernel_ms", "torch_ms", "speedup", "floor_ms", "x_floor")
FUSED = ("kernel_ms", "matmul_ms", "matmul_softmax_multinomial_ms", "speedup_vs_torch",
         "x_matmul", "floor_ms", "x_floor")  # fmt: skip


def benchmark(*args: str, interpret: bool = True) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, "benchmarks/kernels.py", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=patient(300),
    )  # fmt: skip


def positive(row: dict, keys) -> None:
    for key in keys:
        value = row[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value > 0, (key, value)


@pytest.mark.timeout(360)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_the_kernel_benchmark_runs_on_a_cpu(tmp_path):
    plot = tmp_path / "plot.png"
    done = benchmark("--device", "cpu", "--interpret", "--quick", "--plot", str(plot))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert {"machine", "environment", "sampling", "rejection", "fused", "goals", "plot"} <= set(
        result
    )

    environment = result["environment"]
    for key in ("device", "torch"):
        assert isinstance(result["machine"][key], str) and result["machine"][key], key
    for key in ("triton", "mode", "fused_dtype"):
        assert isinstance(environment[key], str) and environment[key], key
    assert "interpreter" in environment["mode"]
    positive(environment, ["read_GBps"])
    assert environment["seed"] not in (0, 1), "a seed of 1 is folded into the kernel by Triton"

    assert [(r["data"], r["vocab"], r["batch"]) for r in result["sampling"]] == [
        ("zipf", 1000, 1),
        ("zipf", 1000, 4),
    ]
    for row in result["sampling"]:
        for kernel in KERNELS:
            positive(row[kernel], TIMED)
        for kernel in ("top_p", "top_k"):
            rounds = row[kernel]["rounds"]
            assert 1 <= rounds["mean"] <= rounds["max"], rounds
            assert sum(rounds["rows_by_rounds"].values()) == row["batch"], rounds
        for kernel in ("sample_from_probs", "gumbel", "top_p", "top_k"):
            tokens = row[kernel]["tokens"]
            assert tokens["valid_ids"] and tokens["positive_and_kept"], (kernel, tokens)
            positive(tokens, ["mean_p_of_token", "expected"])
    assert [r["batch"] for r in result["rejection"]] == [1, 4]
    for row in result["rejection"]:
        assert row["k"] == 4 and row["vocab"] == 1000
        positive(row, TIMED)
    assert [(r["vocab"], r["d_model"], r["batch"]) for r in result["fused"]] == [
        (1000, 64, 1),
        (1000, 64, 4),
    ]
    for row in result["fused"]:
        positive(row, FUSED)
        assert row["meets_goal"] in (True, False)

    goals = result["goals"]
    assert set(goals) == {
        "from_probs_1_5x_floor", "gumbel_6x_floor", "top_p_3x", "top_k_3x_floor_per_round",
        "fused",
    }  # fmt: skip
    for goal in goals.values():
        assert goal["met"] is None and goal["reason"]  # V = 128256, B = 64 was not run
    assert goals["fused"]["failing"] is not None
    assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.timeout(360)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_asking_for_cuda_without_a_gpu_is_a_clear_error():
    done = benchmark("--device", "cuda", "--quick", interpret=False)
    assert done.returncode != 0 and not done.stdout
    assert "no CUDA GPU here" in done.stderr, done.stderr[-2000:]
