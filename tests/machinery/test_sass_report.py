"""benchmarks/sass.py compiles chapter 6's kernels for an H100 here and reads their machine
code: it must run without a GPU, and what it reads must be what the chapter quotes (16-byte
vector loads under a real launch's specialisation, a summed block far cheaper than a scanned
one in the inverse-transform kernel)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from utils import REPO_ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="chapter 6 needs Triton (Linux)"
)


def test_the_inverse_transform_kernel_scans_only_where_a_row_crosses():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "benchmarks/sass.py", "--kernel", "inverse_transform"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
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
