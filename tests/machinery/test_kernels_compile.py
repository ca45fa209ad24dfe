"""Every kernel of chapter 6 compiles for an H100 (sm_90), here, without a GPU.

CI has no GPU, and Triton's interpreter runs Python that a GPU compiler refuses (a `break` in a
loop, a global that is not a constexpr, a tensor index). Triton can compile ahead of time for a
named target, down to the GPU's machine code (cubin), on any Linux machine: so the kernels that
pass the interpreter's tests are also kernels a GPU can run. Each is compiled once per
constexpr branch, in a child process where TRITON_INTERPRET is 0.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

from utils import REPO_ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="chapter 6 needs Triton (Linux)"
)

F32, I32, I64, C = "fp32", "i32", "i64", "constexpr"
ROWS = {"n_rows": I32, "n_cols": I32}
KERNELS = [  # (module, kernel, signature, constexpr values to compile)
    ("row_softmax", "softmax_kernel", {"x_ptr": "*bf16", "out_ptr": "*bf16", **ROWS,
     "BLOCK_B": C, "BLOCK_V": C}, [{"BLOCK_B": 1, "BLOCK_V": 4096}]),
    ("gumbel", "gumbel_kernel", {"logits_ptr": "*fp32", "out_ptr": "*i64", **ROWS,
     "inv_temperature": F32, "seed": I32, "GREEDY": C, "BLOCK_B": C, "BLOCK_V": C},
     [{"GREEDY": g, "BLOCK_B": 1, "BLOCK_V": 2048} for g in (False, True)]),
    ("inverse_transform", "inverse_transform_kernel", {"probs_ptr": "*fp32", "out_ptr": "*i64",
     **ROWS, "seed": I32, "BLOCK_B": C, "BLOCK_V": C}, [{"BLOCK_B": 1, "BLOCK_V": 4096}]),
    ("top_k_top_p", "top_k_top_p_kernel", {"probs_ptr": "*fp32", "out_ptr": "*i64",
     "rounds_ptr": "*i32", **ROWS, "top_k": I32, "top_p": F32, "seed": I32, "MODE": C,
     "MAX_ROUNDS": C, "BLOCK_B": C, "BLOCK_V": C},
     [{"MODE": m, "MAX_ROUNDS": 256, "BLOCK_B": 1, "BLOCK_V": 4096} for m in (0, 1, 2)]),
    ("fused_matmul", "fused_matmul_kernel", {"h_ptr": "*bf16", "w_ptr": "*bf16",
     "score_ptr": "*fp32", "col_ptr": "*i64", "n_rows": I32, "n_vocab": I32, "d_model": I32,
     "n_tiles": I32, "inv_temperature": F32, "seed": I32, "GREEDY": C, "UPCAST": C,
     "BLOCK_B": C, "BLOCK_V": C, "BLOCK_D": C},
     [{"GREEDY": g, "UPCAST": False, "BLOCK_B": 16, "BLOCK_V": 128, "BLOCK_D": 64}
      for g in (False, True)]),
    ("fused_matmul", "fused_matmul_kernel", {"h_ptr": "*fp32", "w_ptr": "*fp32",
     "score_ptr": "*fp32", "col_ptr": "*i64", "n_rows": I32, "n_vocab": I32, "d_model": I32,
     "n_tiles": I32, "inv_temperature": F32, "seed": I32, "GREEDY": C, "UPCAST": C,
     "BLOCK_B": C, "BLOCK_V": C, "BLOCK_D": C},
     [{"GREEDY": g, "UPCAST": False, "BLOCK_B": 16, "BLOCK_V": 128, "BLOCK_D": 64}
      for g in (False, True)]),
    ("rejection", "rejection_kernel", {"target_ptr": "*fp32", "draft_ptr": "*fp32",
     "draft_tokens_ptr": "*i64", "u_ptr": "*fp32", "out_ptr": "*i64", "accepted_ptr": "*i8",
     "n_rows": I32, "k": I32, "n_vocab": I32, "GREEDY": C, "BLOCK_B": C, "BLOCK_V": C},
     [{"GREEDY": g, "BLOCK_B": 1, "BLOCK_V": 4096} for g in (False, True)]),
]  # fmt: skip

SCRIPT = """
import importlib, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

failed = []
for module, kernel, signature, constexprs in eval(sys.argv[1]):
    fn = getattr(importlib.import_module(f"solutions.kernels.{module}"), kernel)
    for values in constexprs:
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature, constexprs=values),
                target=GPUTarget("cuda", 90, 32),
            )
            assert "cubin" in compiled.asm, sorted(compiled.asm)
        except Exception as error:  # report every kernel that fails, not only the first
            failed.append(f"{kernel} {values}: {type(error).__name__}: {error}")
print("\\n\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_kernel_compiles_for_an_h100(tmp_path):
    # One child process for all of them: importing Triton and torch costs seconds each time.
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # "0": compile, although there is no GPU
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, not from an earlier run's cache
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, repr(KERNELS)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"kernels that do not compile for sm_90:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    )
