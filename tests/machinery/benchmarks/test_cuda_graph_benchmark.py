"""benchmarks/cuda_graphs.py needs CUDA: without it, it says so and exits with status 2 (CI has
no GPU; the recorded run, checked by test_readme, came from a lent one)."""

import importlib
import sys

import pytest
import torch


def test_without_cuda_it_says_so_and_exits_2(monkeypatch, capsys):
    module = importlib.import_module("benchmarks.cuda_graphs")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["cuda_graphs.py", "--runs", "1"])
    with pytest.raises(SystemExit) as exit:
        module.main()
    assert exit.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
