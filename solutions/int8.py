"""Weight-only int8: each matrix stored in 8-bit integers, one float scale per output channel.

A decoding step reads every weight once for very little arithmetic per number, so where memory
is the limit (a large model on a GPU), fewer bytes per weight is a faster step: gpt-fast
(pytorch-labs/gpt-fast, `quantize.py`, `WeightOnlyInt8Linear`) stores int8 weights with one
scale per output channel and converts them back in the matrix product. The course's matrices are
`[..., d_in, d_out]` (`x @ W`): a channel is a column, and its scale is its largest magnitude
divided by 127, so that the column's largest weight becomes ±127 and every other weight the
nearest of the 255 integer steps in between (symmetric: no zero point).
"""

import copy

import torch
from jaxtyping import Float, Int8
from torch import Tensor

from solutions.model import DemoTransformer


def quantize_int8(
    W: Float[Tensor, "... d_in d_out"],
) -> tuple[Int8[Tensor, "... d_in d_out"], Float[Tensor, "... d_out"]]:
    """`(q, scale)` with `W ≈ q * scale[..., None, :]`: per column (output channel) of each
    matrix, `scale` = the column's largest magnitude / 127 and `q` = W / scale rounded to the
    nearest integer (ties to even, as `torch.round`), in [-127, 127]. `scale` has W's dtype. A
    column of zeros gets a tiny positive scale, not 0 (no division by zero)."""
    # BEGIN SOLUTION
    scale = W.abs().amax(dim=-2) / 127
    scale = scale.clamp(min=torch.finfo(W.dtype).eps)  # an all-zero column: q = 0, not NaN
    q = torch.round(W / scale.unsqueeze(-2)).clamp(-127, 127).to(torch.int8)
    # END SOLUTION
    return q, scale


def dequantize_int8(
    q: Int8[Tensor, "... d_in d_out"], scale: Float[Tensor, "... d_out"]
) -> Float[Tensor, "... d_in d_out"]:
    """The float matrix that `(q, scale)` stands for."""
    return q.to(scale.dtype) * scale.unsqueeze(-2)


def int8_model(model: DemoTransformer) -> tuple[DemoTransformer, int]:
    """A copy of `model` whose matrices are their int8 versions, converted back to float (what an
    int8 step computes, up to rounding), and the bytes the int8 weights take stored: one byte per
    quantized weight plus the scales, plus every weight left in float."""
    # The matrices a step multiplies by, and the token embedding, whose "channel" is a token: one
    # scale per row. Biases, LayerNorms and the position embedding (small) stay in float.
    matrices = ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_U")
    model = copy.deepcopy(model)
    stored = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in matrices or leaf == "W_E":
                W = param.T if leaf == "W_E" else param  # W_E: one scale per token's row
                q, scale = quantize_int8(W)
                back = dequantize_int8(q, scale)
                param.copy_(back.T if leaf == "W_E" else back)
                stored += q.numel() * q.element_size() + scale.numel() * scale.element_size()
            else:
                stored += param.numel() * param.element_size()
    return model, stored
