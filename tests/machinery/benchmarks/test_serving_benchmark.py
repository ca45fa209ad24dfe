"""benchmarks/serving.py runs (its --quick smoke test, a few seconds) and reports what it says it
reports: both ways of serving the trace with the same tokens, latency percentiles, the KV memory
figures, the prefix trace's exact count, the engine against the machine's prefill rate with
where its steps' time goes, and every goal."""

import importlib
import json
import sys


def test_quick_benchmark_reports_both_servers_the_prefix_trace_and_every_goal(monkeypatch, capsys):
    # In this process: the model and transformers are imported already (a subprocess would
    # spend most of its time importing them again).
    module = importlib.import_module("benchmarks.serving")
    # (glibc left as it is: the rest of this process should not inherit the benchmark's setting)
    monkeypatch.setattr(sys, "argv", ["serving.py", "--quick", "--default-allocator"])
    module.main()
    result = json.loads(capsys.readouterr().out)
    assert result["same_tokens"], "static batching and the engine must write the same tokens"
    for server in ("static", "engine"):
        report = result[server]
        assert report["tokens_per_s"] > 0
        for what in ("ttft_ms", "tpot_ms"):
            assert 0 < report[what]["median"] <= report[what]["p99"], (server, what)
    kv = result["engine"]["kv_positions"]
    assert kv["used"] <= kv["reserved"] <= kv["used"] + kv["one_block_each"]
    goals = result["goals"]
    assert set(goals) == {
        "throughput_1_5x_static",
        "throughput_2x_static",
        "median_ttft_half_of_static",
        "kv_reserved_at_most_used_plus_a_block_each",
        "prefix_positions_computed_exactly_the_uncached",
        "prefix_median_ttft_2x_better",
        "engine_0_6x_prefill_rate",
    }
    assert goals["prefix_positions_computed_exactly_the_uncached"]["met"]
    prefix = result["prefix_trace"]
    assert prefix["caching"]["prompt_tokens_cached"] > 0
    assert prefix["no_caching"]["prompt_tokens_cached"] == 0
    near = result["prefill_rate"]
    assert near["runs"] and all(r["ratio"] > 0 for r in near["runs"])
    assert goals["engine_0_6x_prefill_rate"]["measured"] == near["median_ratio"]
    parts = near["where_step_time_goes"]
    assert 0 < parts["model_forward"] <= parts["steps"], parts
    assert parts["gather_blocks"] > 0 and parts["attention"] > 0, parts
    assert parts["engine_outside_forward"] >= 0 and parts["rest_of_forward"] >= 0, parts


def test_quick_benchmark_on_a_llama_model_sets_it_beside_the_gpt2_model(
    monkeypatch, capsys, tmp_path
):
    """`--model` with a Llama-architecture folder (a random stand-in of the shipped model's
    shape, saved in HF format): the same report for it, and the section that serves it and the
    GPT-2 model with the same KV bytes, whose Llama pool holds 3 times the tokens, and whose
    quarter pool preempts the GPT-2 engine however fast the machine (the requests all present at
    the start fill its seats: served as they arrived, an idle machine never filled them)."""
    import torch

    from solutions.llama import LlamaTransformer
    from solutions.llama_config import LlamaConfig
    from utils.models import load_hf, save_model

    tokenizer = load_hf("shakespeare")[1]
    cfg = LlamaConfig(d_model=192, d_vocab=len(tokenizer), n_ctx=256, d_head=32, d_mlp=624,
                      n_heads=6, n_kv_heads=2, n_layers=4, rope_theta=1e4)  # fmt: skip
    torch.manual_seed(0)
    folder = save_model(LlamaTransformer(cfg), tokenizer, tmp_path / "llama")
    module = importlib.import_module("benchmarks.serving")
    argv = ["serving.py", "--quick", "--default-allocator", "--no-prefill-rate"]
    monkeypatch.setattr(sys, "argv", [*argv, "--model", str(folder)])
    module.main()
    result = json.loads(capsys.readouterr().out)
    assert result["model"]["architecture"] == "LlamaTransformer"
    assert (
        result["same_tokens"]
        and result["goals"]["prefix_positions_computed_exactly_the_uncached"]["met"]
    )
    beside = result["beside_gpt2"]
    for budget in ("whole_trace", "a_quarter"):
        pools = beside[budget]["pool"]
        assert pools["gpt2"]["bytes"] == pools["llama"]["bytes"] == beside[budget]["kv_bytes"]
        assert (pools["gpt2"]["bytes_per_token"], pools["llama"]["bytes_per_token"]) == (6144, 2048)
        assert pools["llama"]["tokens"] == 3 * pools["gpt2"]["tokens"]
        assert all(r["gpt2"] > 0 and r["llama"] > 0 for r in beside[budget]["runs"])
        schedule = beside[budget]["schedule"]
        for name in ("gpt2", "llama"):
            blocks = schedule[name]["most_blocks_in_use"]
            assert 0 < blocks <= pools[name]["num_blocks"], (budget, name, blocks)
            # every token is computed or found in the cache at least once
            work = (
                schedule[name]["tokens_computed"] + schedule[name]["tokens_found_in_prefix_cache"]
            )
            assert work >= schedule["tokens_once_each"], (budget, name)
    whole, quarter = beside["whole_trace"], beside["a_quarter"]
    assert whole["preemptions"] == {"gpt2": 0, "llama": 0}, "the whole trace's pool holds it all"
    assert quarter["preemptions"]["gpt2"] > 0, (
        "a quarter of the bytes must be too small for the GPT-2 engine's seats on any machine"
    )
    assert (
        quarter["schedule"]["gpt2"]["most_blocks_in_use"] == quarter["pool"]["gpt2"]["num_blocks"]
    )
    goals = result["goals"]
    assert goals["llama_pool_tokens_for_the_same_bytes"]["met"]
    measured = goals["llama_tokens_per_s_at_least_gpt2s"]["measured"]
    assert measured == beside["whole_trace"]["median_ratio"] > 0
