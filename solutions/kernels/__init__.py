"""Chapter 10: GPU sampling kernels in Triton, each the same contract as a PyTorch reference of
an earlier chapter. Importing this package chooses how kernels run (runtime.py): compiled on a
CUDA GPU, else through Triton's interpreter on the CPU.

    runtime.py            the mode (GPU or interpreter), tile sizes, argument checks
    row_softmax.py        softmax(x): the Triton programming model on a row-wise softmax
    gumbel.py             gumbel_sample(logits, temperature, seed): argmax(logits / T + G)
    inverse_transform.py  sample_from_probs(probs, seed): one uniform, block-wise prefix sums
    top_k_top_p.py        top_k_top_p_sample(probs, top_k, top_p, seed): dual-pivot rejection
    fused_matmul.py       fused_matmul_sample(hidden, W_U, temperature, seed): no logits in memory
    rejection.py          rejection_sample(...): chapter 6's speculative sampler as one kernel
"""

# First: runtime sets TRITON_INTERPRET (no GPU) before any kernel below is defined.
from solutions.kernels import runtime  # noqa: F401, I001
from solutions.kernels.fused_matmul import fused_matmul_sample
from solutions.kernels.gumbel import gumbel_sample
from solutions.kernels.inverse_transform import sample_from_probs
from solutions.kernels.rejection import rejection_sample
from solutions.kernels.row_softmax import softmax
from solutions.kernels.top_k_top_p import top_k_top_p_sample

__all__ = [
    "fused_matmul_sample",
    "gumbel_sample",
    "rejection_sample",
    "sample_from_probs",
    "softmax",
    "top_k_top_p_sample",
]
