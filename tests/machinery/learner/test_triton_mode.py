"""Triton's mode is chosen before anything can import Triton, and a process that imported it in
the wrong mode still grades every chapter but 10, with a message saying why chapter 10 cannot.

Each case runs in a fresh process whose environment has no TRITON_INTERPRET, as a learner's
terminal or kernel (this test process chose the interpreter long ago)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from utils import REPO_ROOT
from utils.timing import patient

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's choice only")


def run_fresh(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON", "COURSE_"))}
    env["PYTEST_ADDOPTS"] = ""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=patient(300),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(360)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_importing_the_course_chooses_the_interpreter_before_a_model_imports_triton():
    got = run_fresh(
        "import json, os, sys\n"
        "from solutions import Config\n"  # any notebook's setup cell
        "from utils.models import load_model\n"
        "load_model('shakespeare')\n"  # building the HF model imports triton
        "import triton.language as tl\n"
        "print(json.dumps({'env': os.environ.get('TRITON_INTERPRET'),\n"
        "    'tl': type(tl.zeros).__name__}))\n"
    )
    assert got == {"env": "1", "tl": "InterpretedFunction"}


@pytest.mark.timeout(360)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_triton_imported_in_the_wrong_mode_breaks_chapter_10_only_and_says_why():
    got = run_fresh(
        "import json\n"
        "import triton.language\n"  # before the course could choose: compiled mode
        "from utils.check import run_graded\n"
        "ch1 = run_graded(['--impl', 'solutions', '-m', 'layernorm'], chapter='01_transformer')\n"
        "ch10 = run_graded(['--impl', 'solutions', '-m', 'softmax_kernel'], chapter='10_kernels')\n"
        "print(json.dumps({'ch1': sorted({r.outcome for r in ch1.results}),\n"
        "    'ch10': [r.message for r in ch10.errors]}))\n"
    )
    assert got["ch1"] == ["passed"]
    assert len(got["ch10"]) == 1 and "test_10_kernels.py" in got["ch10"][0]
    assert "Triton was imported before TRITON_INTERPRET=1 was set" in got["ch10"][0]
    assert "Restart the kernel" in got["ch10"][0]
