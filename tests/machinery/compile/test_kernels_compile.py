"""Every kernel of chapter 10 compiles for an H100 (sm_90), here, without a GPU.

CI has no GPU, and Triton's interpreter runs Python that a GPU compiler refuses (a `break` in a
loop, a global that is not a constexpr, a tensor index). Triton can compile ahead of time for a
named target, down to the GPU's machine code (cubin), on any Linux machine: so the kernels that
pass the interpreter's tests are also kernels a GPU can run. Each is compiled as the launches a
GPU runs compile it, with the same specialisation (16-byte divisibility of the pointers and of
the sizes that are multiples of 16) and each constexpr branch, in a child process where
TRITON_INTERPRET is 0: the launches and the machinery are the graded compile tests' own
(utils/kernel_compile.py); here the kernels are imported from `solutions.kernels`, as the
package ships them.
"""

import pytest

from tests.support import needs_triton
from utils.kernel_compile import LAUNCHES, Job, Launch, explain, run_compiler
from utils.timing import patient

pytestmark = needs_triton


@pytest.mark.timeout(660)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_every_kernel_compiles_for_an_h100():
    # One child process for all of them: importing Triton and torch costs seconds each time.
    jobs = [
        Job(f"solutions.kernels.{launch.module}", launch.kernel, launch)
        for launches in LAUNCHES.values()
        for launch in launches
    ]
    failures = run_compiler(jobs, timeout_s=600)
    assert not failures, "kernels that do not compile for sm_90:\n\n" + "\n\n".join(
        explain(failure) for failure in failures
    )


@pytest.mark.timeout(360)  # longer than its subprocess's own limit, at every COURSE_TIME_SCALE
def test_a_kernel_the_interpreter_runs_and_a_gpu_refuses_fails_here(tmp_path):
    # The check itself, on a planted `break` (one compile, about a second): it must fail, and
    # say why and where.
    kernel = tmp_path / "planted.py"
    kernel.write_text(
        "import triton\n"
        "import triton.language as tl\n"
        "\n"
        "\n"
        "@triton.jit\n"
        "def planted(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    for start in range(0, n, BLOCK):\n"
        "        if start > 0:\n"
        "            break\n"
    )
    launch = Launch("planted", "planted", ("*fp32", 128_256), ({"BLOCK": 1024},))
    (failure,) = run_compiler([Job("planted", "planted", launch, str(tmp_path))])
    assert (failure.file, failure.line) == (str(kernel), 9), failure
    message = explain(failure)
    assert "`break` is not supported" in message and f"line 9 of {kernel}" in message, message


def test_an_accumulator_rounded_to_16_bits_fails_here(tmp_path):
    # The interpreter hides this one (it upcasts bfloat16 tiles before tl.dot, so the cast goes
    # to float32 there): the fused kernel with its float32 scores cast back to the input dtype
    # before the argmax must fail the compiled check.
    from pathlib import Path

    import solutions.kernels.fused_matmul as fused

    source = Path(fused.__file__).read_text()
    planted = source.replace(
        "        scores = acc\n", "        scores = acc.to(h_ptr.dtype.element_ty)\n"
    )
    assert planted != source, "test set-up: the line to plant the cast on has moved"
    (tmp_path / "planted_fused.py").write_text(planted)
    launch = next(x for x in LAUNCHES["fused_matmul"] if x.forbid)
    launch = Launch(**{**launch.__dict__, "branches": (launch.branches[-1],)})  # greedy only
    failures = run_compiler([Job("planted_fused", "fused_matmul_kernel", launch, str(tmp_path))])
    assert failures and "rounded to 16 bits" in failures[0].error, failures


def test_the_compiled_launches_are_the_wrappers_own(monkeypatch):
    # utils/kernel_compile.py repeats runtime.row_block's GPU choice (it cannot import the
    # runtime in its compiler child): the blocks and warps it compiles must be the ones each
    # wrapper asks row_block for, which the wrappers are called here to find out.
    import torch

    import solutions.kernels as k
    from solutions.kernels import runtime
    from utils.kernel_compile import V

    asked = {}

    def spy(name):
        def row_block(n_cols, gpu_block):
            asked[name] = gpu_block
            return runtime.row_block(n_cols, gpu_block)

        return row_block

    wrappers = {
        "softmax_kernel": ("row_softmax", lambda: k.softmax(torch.rand(2, 8))),
        "gumbel_kernel": ("gumbel", lambda: k.gumbel_sample(torch.rand(2, 8), 1.0, 0)),
        "inverse_transform": (
            "inverse_transform",
            lambda: k.sample_from_probs(torch.ones(2, 8) / 8),
        ),
        "top_k_top_p": (
            "top_k_top_p",
            lambda: k.top_k_top_p_sample(torch.ones(2, 8) / 8, top_p=0.9),
        ),
        "rejection_kernel": (
            "rejection",
            lambda: k.rejection_sample(
                torch.ones(2, 3, 8) / 8, torch.ones(2, 2, 8) / 8, torch.zeros(2, 2).long()
            ),
        ),
    }
    for name, (module, call) in wrappers.items():
        monkeypatch.setattr(f"solutions.kernels.{module}.row_block", spy(name))
        call()
        block, warps = runtime.gpu_row_block(V, asked[name])
        for launch in LAUNCHES[name]:
            # The rejection wrapper passes no num_warps: Triton's default, 4.
            options = launch.options or {"num_warps": 4}
            assert options == {"num_warps": warps}, (name, launch.options)
            assert {b["BLOCK_V"] for b in launch.branches} == {block}, (name, launch.branches)


def test_the_graded_tests_cap_gpu_blocks_at_the_interpreters(monkeypatch):
    # On a GPU the wrappers' blocks hold 4,096 to 16,384 columns, so the graded tests' rows of
    # 2,500 would fit in one block there, and a kernel that mishandles a second block would
    # pass. runtime.GPU_BLOCK_CAP, which chapter 10's graded tests set, gives a GPU the
    # interpreter's 1,024-column blocks; unset, the wrappers' own choice stands.
    from solutions.kernels import runtime

    monkeypatch.setattr(runtime, "INTERPRET", False)  # the GPU's branch, without a GPU
    assert runtime.row_block(2_500, gpu_block=16_384) == (4_096, 4)
    monkeypatch.setattr(runtime, "GPU_BLOCK_CAP", 1_024)
    assert runtime.row_block(2_500, gpu_block=16_384) == (1_024, 4)
    assert runtime.row_block(500, gpu_block=4_096) == (512, 4)


STUB_ON_A_GPU = """
import ast, sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from utils.grading import is_not_implemented


@triton.jit
def blank(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    raise NotImplementedError()


@triton.jit
def refuses(x_ptr, n, BLOCK: tl.constexpr):
    raise ValueError("n")


for kernel in (blank, refuses):
    source = ASTSource(
        kernel, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 16},
    )
    try:
        triton.compile(source, target=GPUTarget("cuda", 90, 32))
        print(kernel.__name__, "compiled")
    except Exception as err:
        print(kernel.__name__, type(err).__name__, is_not_implemented(err))
"""


def test_a_blank_kernel_refused_by_a_gpu_compiler_is_not_implemented(tmp_path):
    """On a GPU a kernel compiles before it runs, and the compiler takes no `raise`: the blank
    kernel's `raise NotImplementedError()` fails to compile (seen on an H100) where the
    interpreter raises. Grading must still call it not implemented yet, and only it."""
    import os
    import subprocess
    import sys

    from utils import REPO_ROOT

    script = tmp_path / "stub_on_a_gpu.py"
    script.write_text(STUB_ON_A_GPU)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=patient(300),
    )  # fmt: skip
    assert done.stdout.split("\n")[:2] == [
        "blank UnsupportedLanguageConstruct True",
        "refuses UnsupportedLanguageConstruct False",
    ], done.stdout + done.stderr[-2000:]
