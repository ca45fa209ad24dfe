"""benchmarks/structured.py runs (its --quick smoke test) and reports what it says it reports:
every kind of constraint on both models with its outside check, the masks' share of a step for
both backends, the three compile times with their ratios, and the goals."""

import importlib
import json
import sys

from tests.support import LLAMA_MODEL


def test_quick_benchmark_reports_validity_mask_cost_compile_times_and_goals(monkeypatch, capsys):
    module = importlib.import_module("benchmarks.structured")
    monkeypatch.setattr(sys, "argv", ["structured.py", "--quick", "--llama", LLAMA_MODEL])
    module.main()
    result = json.loads(capsys.readouterr().out)["cpu"]
    kinds = {"regex", "choice", "json_flat", "json_nested", "grammar"}
    for model in ("gpt2", "llama"):
        counts = result["validity"][model]
        assert set(counts) == kinds
        for c in counts.values():
            assert c["answers"] == 8 and 0 <= c["valid"] <= c["finished"] <= 8
            assert c["invalid"] == c["finished"] - c["valid"] == 0
    for backend in ("index", "xgrammar"):
        cost = result["mask_cost"][backend]
        assert cost["batch"] == 32 and cost["mask_us_per_step"] > 0 and cost["step_us"] > 0
        assert 0 < cost["mask_share_of_step"] < 1
    compiled = result["compile"]
    assert set(compiled["ms"]) == {"course", "course_index_only", "outlines_core", "xgrammar"}
    assert all(v > 0 for v in compiled["ms"].values())
    assert compiled["course_over_outlines_core"] > 0 and compiled["course_over_xgrammar"] > 0
    assert compiled["states"]["outlines_core"] > 0 and compiled["states"]["course"] > 0
    for c in result["sampler_validity"].values():
        assert c["answers"] == 4 and c["invalid"] == c["finished"] - c["valid"] == 0
    dist = result["distortion"]
    assert set(dist["conditioned"]) == set(dist["masked_each_step"]) == {
        "Romeo", "Juliet", "Tybalt", "Mercutio"}  # fmt: skip
    assert abs(sum(dist["conditioned"].values()) - 1) < 0.01
    assert dist["kl_conditioned_masked_texts_nats"] > 0 and dist["token_paths"] > 4
    jump = result["jump_forward"]
    assert set(jump["forms"]) == {"none", "exact", "text"}
    for form in jump["forms"].values():
        assert form["valid"] == form["finished"] <= jump["answers"] == 4
        assert form["calls_per_answer"] > 0 and 0 < form["calls_per_token"] <= 1
        assert set(form["tv_from_none"]) == {"speaker", "act", "lines"}
        assert all(0 <= tv <= 1 for tv in form["tv_from_none"].values())
    assert set(jump["tv_between_halves_of_none"]) == {"speaker", "act", "lines"}
    assert jump["forms"]["exact"]["greedy_text_as_token_by_token"]
    assert jump["forms"]["none"]["calls_per_token"] == 1.0  # one model call per token
    goals = result["goals"]
    assert set(goals) == {"no_invalid_answer", "masks_at_most_10_percent_of_a_step_index",
                          "masks_at_most_10_percent_of_a_step_xgrammar",
                          "text_jump_forward_1_5x_fewer_calls_answers_valid"}  # fmt: skip
    assert goals["no_invalid_answer"]["met"] is True
    for backend in ("index", "xgrammar"):
        share = goals[f"masks_at_most_10_percent_of_a_step_{backend}"]["measured"]
        assert share == result["mask_cost"][backend]["mask_share_of_step"]
