"""benchmarks/speculative.py runs (its --quick smoke test, about 10 s) and reports what it says
it reports: every workload, method and goal, greedy runs identical to the baseline."""

import json
import subprocess
import sys

import pytest

from utils import REPO_ROOT
from utils.timing import patient


@pytest.mark.timeout(360)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_quick_benchmark_reports_every_workload_method_and_goal():
    run = subprocess.run(
        [sys.executable, "benchmarks/speculative.py", "--quick"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=patient(300),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert set(result["workloads"]) == {"open-ended", "looping", "input-grounded"}
    for workload, report in result["workloads"].items():
        assert 0 <= report["text"]["greedy_repeat_rate"] <= 1, workload
        assert set(report["T=0"]) >= {"model", "ngram", "lookahead"}, workload
        for method in ("model", "ngram", "lookahead"):
            for config, row in report["T=0"][method].items():
                assert row["identical"], f"{workload} {method} {config}: not the baseline's tokens"
                assert row["speedup"] > 0 and row["predicted_speedup"] > 0
    assert set(result["goals"]) == {"goal1", "goal2", "goal3", "goal4", "goal5"}
    assert result["goals"]["goal5"]["met"]
    what_if = result["what_if"]
    assert what_if["gpu_like"]["speedup"] > what_if["measured_c_and_v"]["speedup"]


def test_the_round_clock_sees_a_notebooks_own_forward_passes(shipped):
    # A notebook's generators call the forward_with_cache of the notebook's globals, not the
    # module's: the clock must time those (else the whole round is counted as fixed cost).
    import torch

    from solutions.cached_model import forward_with_cache
    from solutions.speculative_generation import SpeculativeStats
    from utils import speed

    model = shipped[0]
    namespace = {"forward_with_cache": forward_with_cache, "model": model, "torch": torch}
    exec(
        "def run(stats):\n"
        "    for _ in range(5):\n"
        "        forward_with_cache(model, torch.arange(1, 40)[None])\n"
        "        stats.main_passes += 1\n",
        namespace,
    )
    costs = speed.round_costs(
        namespace["run"], SpeculativeStats, model, s1=1.0, repeats=1, namespace=namespace
    )
    assert costs["pass"] > 5 * costs["f"], costs
    assert namespace["forward_with_cache"] is forward_with_cache, "the clock must be taken off"
