"""benchmarks/llama.py runs (its --quick smoke test) and reports what it says it reports: the
cached step of both models with the operations each dispatches, the fast sampler eager and
compiled on both with chapter 4's tokens and no recompilation, the KV-cache bytes per token
measured from the caches, and both goals."""

import importlib
import json
import sys

from tests.support import LLAMA_MODEL


def test_quick_benchmark_reports_both_models_the_kv_bytes_and_both_goals(monkeypatch, capsys):
    # In this process: the models and transformers are imported already.
    module = importlib.import_module("benchmarks.llama")
    monkeypatch.setattr(sys, "argv", ["llama.py", "--quick", "--llama", LLAMA_MODEL])
    module.main()
    result = json.loads(capsys.readouterr().out)["cpu"]
    sizes = result["parameters"]
    assert abs(sizes["llama"] / sizes["gpt2"] - 1) < 0.01, "matched parameters"
    step = result["cached_step"]
    assert all(v > 0 for v in step["us_per_step"].values()) and step["llama_over_gpt2"] > 0
    assert step["aten_ops_per_step"]["llama"] > 0 and step["aten_ops_per_step"]["gpt2"] > 0
    parts = step["llama_parts_us_per_step"]
    assert set(parts) == {"rotary", "expand_kv", "projections_einops", "projections_as_gpt2_step"}
    assert all(v > 0 for v in parts.values())
    fast = result["fast_sampler"]
    methods = {f"{m}_{how}" for m in ("gpt2", "llama") for how in ("eager", "compiled")}
    assert set(fast["tokens_per_s"]) == methods and all(fast["same_tokens_as_cached"].values())
    assert fast["compiled"]["recompilations"] == 0
    assert fast["compiled"]["decode_step_compilations"] == 2  # one per model
    kv = result["kv_cache"]
    for name in ("gpt2", "llama"):
        m = kv[name]
        # keys and values, every layer, float32: measured from the tensors, checked by hand
        assert m["bytes_per_token"] == 2 * m["n_layers"] * m["kv_heads"] * m["d_head"] * 4
        assert m["static_bytes_per_token"] == m["bytes_per_token"]
    assert kv["gpt2_over_llama"] == kv["llama"]["query_heads"] / kv["llama"]["kv_heads"] == 3.0
    goals = result["goals"]
    assert set(goals) == {
        "llama_step_at_most_1_2x_gpt2",
        "kv_cache_n_heads_over_n_kv_heads_smaller",
    }
    assert goals["kv_cache_n_heads_over_n_kv_heads_smaller"]["met"]
    assert goals["llama_step_at_most_1_2x_gpt2"]["measured"] == step["llama_over_gpt2"]
    assert "operations" in goals["llama_step_at_most_1_2x_gpt2"]["why"]
