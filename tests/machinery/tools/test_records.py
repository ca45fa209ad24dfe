"""utils/records.py, the one writer of benchmarks/results/*.json: a rate is a count over the
median of runs, a verdict ends with `met`, and `--record` writes the layout the chapters and the
README's tests read (command, machine, date, code, result), the result as printed."""

import argparse
import json
import sys

from utils.records import (
    add_record_options,
    emit,
    goal,
    machine,
    median_run,
    rate,
    us_each,
    verdict,
)


def test_a_rate_is_a_count_over_the_median_of_the_runs():
    assert rate(100, [2.0, 1.0, 4.0]) == 50.0  # median 2 s, not the mean (7/3 s)
    assert rate(1, [3.0], digits=None) == 1 / 3
    assert us_each([0.002, 0.001, 0.003], 1000) == 2.0
    assert us_each([0.003], 7, digits=None) == 1e6 * 0.003 / 7
    # The run reported in full: the median's, the upper middle one of an even count.
    runs = [{"ratio": r} for r in (0.9, 0.7, 1.1, 0.8)]
    assert median_run(runs, key=lambda r: r["ratio"]) == {"ratio": 0.9}


def test_verdicts_keep_their_fields_and_end_with_met():
    assert list(verdict(True, measured=3, expected=3)) == ["measured", "expected", "met"]
    assert verdict(None, reason="not run") == {"reason": "not run", "met": None}
    assert goal("x", 1.0, 2.0, at_least=False) == {
        "what": "x", "measured": 1.0, "target": 2.0, "met": True,
    }  # fmt: skip


def test_the_machine_has_one_shape():
    described = machine()
    assert {"processor", "platform", "cpus", "python", "torch", "torch_threads", "device"} <= set(
        described
    )
    assert described["device"] == "cpu"


def test_record_writes_the_printed_result_with_command_machine_date_and_code(
    tmp_path, monkeypatch, capsys
):
    parser = argparse.ArgumentParser()
    add_record_options(parser)
    path = tmp_path / "x.json"
    args = parser.parse_args(["--record", str(path), "--machine-note", "idle"])
    monkeypatch.setattr(sys, "argv", ["benchmarks/x.py", "--runs", "3"])
    result = {"machine": machine(), "goals": {"g": goal("x", 2.0, 1.0, at_least=True)}}
    emit(result, args)
    printed = json.loads(capsys.readouterr().out)
    written = json.loads(path.read_text())
    assert list(written) == ["command", "machine", "date", "code", "result"]
    assert written["result"] == printed == result
    assert written["command"].endswith("x.py --runs 3")
    assert written["machine"].endswith("; idle") and "torch" in written["machine"]
    assert written["code"].startswith(("commit ", "unknown"))
