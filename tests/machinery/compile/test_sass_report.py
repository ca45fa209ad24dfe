"""benchmarks/sass.py compiles chapter 10's kernels for an H100 here and reads their machine
code: it must run without a GPU, and what it reads must be what the chapter quotes (16-byte
vector loads under a real launch's specialisation, a summed block far cheaper than a scanned
one in the inverse-transform kernel)."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import needs_triton
from utils import REPO_ROOT
from utils.timing import patient

pytestmark = needs_triton


@pytest.mark.timeout(360)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_the_inverse_transform_kernel_scans_only_where_a_row_crosses():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "benchmarks/sass.py", "--kernel", "inverse_transform"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=patient(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(done.stdout)["kernels"]["inverse_transform"]
    loop = row["main_loop"]
    assert set(loop["global_loads"]) == {"LDG.E.128"}, loop  # 16-byte loads only
    assert row["spill_bytes"] == 0, row
    around = loop["path_around_it"]
    # A summed block: at most half the instructions of a scanned one, and fewer barriers.
    assert around["instructions"] * 2 <= loop["instructions"], loop
    assert around["barriers"] < loop["barriers"], loop


@pytest.mark.timeout(660)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_tensor_cores_start_at_sm_80():
    # Chapter 10 tells a learner on a Colab T4 (sm_75) that the fused kernel's tl.dot runs on
    # the ordinary float32 units there: no mma; an A100 (sm_80) multiplies with HMMA.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    loops = {}
    for arch in (75, 80):
        done = subprocess.run(
            [sys.executable, "benchmarks/sass.py", "--kernel", "fused_matmul", "--arch", str(arch)],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=patient(300),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        bf16 = json.loads(done.stdout)["kernels"]["fused_matmul"][0]  # the bf16 launch
        loops[arch] = bf16["main_loop"]
    assert loops[75]["mma"] == loops[75]["wgmma"] == 0 and loops[75]["ffma"] > 0, loops[75]
    assert loops[80]["mma"] > 0 and loops[80]["ffma"] == 0, loops[80]
