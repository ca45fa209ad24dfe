"""Chapter 6: GPU sampling kernels in Triton, each the same contract as a PyTorch reference of
an earlier chapter. Importing this package chooses how kernels run (runtime.py): compiled on a
CUDA GPU, else through Triton's interpreter on the CPU.

    runtime.py            the mode (GPU or interpreter), tile sizes, argument checks
    softmax.py            softmax(x): the Triton programming model on a row-wise softmax
    gumbel.py             gumbel_sample(logits, temperature, seed): argmax(logits / T + G)
    inverse_transform.py  sample_from_probs(probs, seed): one uniform, block-wise prefix sums
    top_k_top_p.py        top_k_top_p_sample(probs, top_k, top_p, seed): dual-pivot rejection
    fused_matmul.py       fused_matmul_sample(hidden, W_U, temperature, seed): no logits in memory
    rejection.py          rejection_sample(...): chapter 5's speculative sampler as one kernel
"""

from solutions.kernels import runtime  # noqa: F401  first: sets TRITON_INTERPRET before Triton is imported
