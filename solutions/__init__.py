"""Reference implementation of the course: one concept per module, read top to bottom.

Chapter 1 builds the GPT-2 architecture piece by piece:

    config.py      Config: the hyper-parameters every module reads
    tokens.py      token_strings: what the model actually sees
    layernorm.py   LayerNorm
    embed.py       Embed (token embedding) and PosEmbed (learned positions)
    attention.py   Attention, with its causal mask
    mlp.py         MLP with GPT-2's tanh-approximated GELU
    block.py       TransformerBlock: pre-LN attention + MLP with residual connections
    unembed.py     Unembed: back from the residual stream to vocabulary logits
    model.py       DemoTransformer: the whole model
"""

from solutions.attention import Attention
from solutions.block import TransformerBlock
from solutions.config import Config
from solutions.embed import Embed, PosEmbed
from solutions.layernorm import LayerNorm
from solutions.mlp import MLP
from solutions.model import DemoTransformer
from solutions.tokens import token_strings
from solutions.unembed import Unembed

__all__ = [
    "Attention",
    "Config",
    "DemoTransformer",
    "Embed",
    "LayerNorm",
    "MLP",
    "PosEmbed",
    "TransformerBlock",
    "Unembed",
    "token_strings",
]
