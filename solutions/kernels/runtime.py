"""Where chapter 10's kernels run, and what every kernel's wrapper shares.

With a CUDA GPU, Triton compiles each kernel for it. Without one, Triton's interpreter runs the
same kernel source on the CPU, one program after another, with numpy standing in for the GPU's
registers: slow, but exact enough to test every kernel. The choice (TRITON_INTERPRET=1) is made
by solutions/triton_mode.py when `solutions` is first imported, before anything can import
Triton; this module checks that it held.
"""

from __future__ import annotations

import torch
from torch import Tensor

from solutions import triton_mode

triton_mode.choose()  # made already when `solutions` was imported: then this does nothing

INTERPRET: bool = triton_mode.interpreting()
DEVICE: str = "cpu" if INTERPRET else "cuda"

try:
    import triton.language  # noqa: F401
except ImportError as error:  # pragma: no cover - Triton is a Linux-only dependency
    raise ImportError(
        "chapter 10 needs Triton, which is installed with the course on Linux only "
        "(pip install triton). On macOS and Windows the chapter cannot run its kernels."
    ) from error

if INTERPRET and triton_mode.imported_compiled():
    raise RuntimeError(
        "Triton was imported before TRITON_INTERPRET=1 was set, so its own library is compiled "
        "code that the interpreter cannot run (something imported triton before `solutions` or "
        "`utils` was imported). Restart the kernel and run the setup cell first; the other "
        "chapters do not need Triton and grade as usual."
    )


def mode() -> str:
    """How kernels run here, in words (the notebook prints it)."""
    if INTERPRET:
        return "Triton interpreter on the CPU (TRITON_INTERPRET=1): correct, slow"
    return f"compiled for {torch.cuda.get_device_name()}"


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# The most columns a block may hold on a GPU, or None for the wrappers' own choice. The graded
# tests set it to the interpreter's 1,024 (tests/graded/test_10_kernels.py), so that their rows
# of a few thousand columns span several blocks on a GPU too, as they do under the interpreter.
GPU_BLOCK_CAP: int | None = None


def row_block(n_cols: int, gpu_block: int) -> tuple[int, int]:
    """(BLOCK_V, num_warps) for a kernel that walks each row in blocks of BLOCK_V columns.

    The interpreter: at most 1024 columns (it runs many rows per program instead; num_warps
    means nothing to it). A GPU: up to `gpu_block` columns, 32 per thread (num_warps =
    BLOCK_V / 1024, from 4 to 16). A program issues all of a block's loads before it uses any,
    so its block is the bytes it keeps in flight, and memory stays busy only with bandwidth x
    latency in flight (Little's law): on an H100 about 3.35 TB/s x 0.6 us, 2 MB, or 32 KB for
    each of 64 rows. A block of 4,096 float32 holds 16 KB; one of 16,384, 64 KB."""
    if INTERPRET:
        return min(next_power_of_2(n_cols), 1024), 4
    return gpu_row_block(n_cols, min(gpu_block, GPU_BLOCK_CAP or gpu_block))


def gpu_row_block(n_cols: int, gpu_block: int) -> tuple[int, int]:
    """row_block's choice on a GPU (the compile tests launch what a GPU launches)."""
    block = min(next_power_of_2(n_cols), gpu_block)
    return block, max(4, min(16, block // 1024))


def rows_per_program(n_rows: int, row_block: int) -> int:
    """BLOCK_B, the rows each program handles. The interpreter's cost is per program and per
    block operation, not per element: it wants few programs with many rows each (capped so a
    tile of rows x row_block elements stays small). A GPU wants many programs, so one row each
    and the rows spread over the multiprocessors."""
    if not INTERPRET:
        return 1
    cap = 1 << max(0, ((1 << 18) // max(row_block, 1)).bit_length() - 1)  # a power of 2
    return min(next_power_of_2(n_rows), cap, 1024)


def kernel_tensor(name: str, t, ndim: int, floating: bool = True) -> Tensor:
    """`t` as the kernels need it: a tensor of `ndim` dimensions on the kernels' device
    (the GPU, or the CPU under the interpreter), contiguous. A ValueError names what is wrong."""
    if not isinstance(t, Tensor) or t.ndim != ndim:
        shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a tensor with {ndim} dimensions, got {shape}")
    if floating and not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if t.device.type != DEVICE:
        raise ValueError(
            f"{name} is on {t.device}, but kernels here run on {DEVICE!r} ({mode()}): "
            f"move it with .to({DEVICE!r})"
        )
    if t.numel() == 0:
        raise ValueError(f"{name} is empty, shape {tuple(t.shape)}")
    return t.contiguous()


def seed_value(seed) -> int:
    """The seed Triton's tl.rand takes: a non-negative int below 2**31."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be an integer in [0, 2**31), got {seed!r}")
    return seed


def refuse_empty_rows(tokens: Tensor, probs: Tensor, name: str) -> Tensor:
    """`tokens`, unless a kernel wrote -1 for a row: its marker for a row of `name` with no
    positive probability (all zeros, or NaN), where no token can be drawn. Such rows are a
    ValueError that names them. Only the [batch] tokens are read, and the marked rows: if one of
    those does hold a positive probability, the kernel itself is wrong, and the error says so."""
    marked = tokens < 0
    if not bool(marked.any()):
        return tokens
    rows = marked.nonzero()[:, 0]
    shown = ", ".join(map(str, rows[:8].tolist())) + (", ..." if rows.numel() > 8 else "")
    sampleable = (probs[rows] > 0).any(dim=-1)  # NaN > 0 is False
    if bool(sampleable.any()):
        row = int(rows[sampleable][0])
        raise RuntimeError(
            f"the kernel returned -1 (no token) for row {row} of {name}, which has positive "
            "probabilities: -1 is only for rows with none (all zeros, or NaN). Every other row "
            "must get a token."
        )
    raise ValueError(
        f"{name}: row(s) {shown} have no positive probability (all zeros, or NaN): there is "
        "nothing to sample. Check what produced them (a softmax of a row of -inf logits is NaN)."
    )
