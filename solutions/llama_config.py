"""The hyper-parameters of a Llama-style model (today's block), named as in the course's Config.

The fields GPT-2 has keep their names; the new ones are what today's block adds: key/value
heads shared by groups of query heads (`n_kv_heads`), the base of the rotary angles
(`rope_theta`) and RMSNorm's epsilon. The defaults are SmolLM2-135M's.
"""

from dataclasses import dataclass

from solutions import checks


@dataclass
class LlamaConfig:
    d_model: int = 576  # width of the residual stream
    d_vocab: int = 49152  # number of tokens the model knows
    init_range: float = 0.02  # std of the normal initialisation of every weight
    n_ctx: int = 8192  # longest sequence the model reads (no learned positions: a limit only)
    d_head: int = 64  # width of one head's queries, keys and values
    d_mlp: int = 1536  # hidden width of the gated MLP
    n_heads: int = 9  # query heads
    n_kv_heads: int = 3  # key/value heads, each shared by n_heads // n_kv_heads query heads
    n_layers: int = 30
    rms_norm_eps: float = 1e-5  # added to the mean square inside the square root
    rope_theta: float = 100000.0  # base of the rotary angles: pair i turns by theta^(-2i/d_head)

    def __post_init__(self) -> None:
        for name in ("d_model", "d_vocab", "n_ctx", "d_head", "d_mlp", "n_heads", "n_kv_heads",
                     "n_layers"):  # fmt: skip
            checks.integer(f"LlamaConfig.{name}", getattr(self, name), low=1)
        checks.positive("LlamaConfig.rms_norm_eps", self.rms_norm_eps)
        checks.positive("LlamaConfig.init_range", self.init_range)
        checks.positive("LlamaConfig.rope_theta", self.rope_theta)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"LlamaConfig.n_kv_heads must divide n_heads={self.n_heads} (each key/value head "
                f"serves a whole group of query heads), got {self.n_kv_heads}"
            )
        if self.d_head % 2:
            raise ValueError(
                f"LlamaConfig.d_head must be even (rotary embeddings turn pairs), got {self.d_head}"
            )

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: n_heads for multi-query, 1 for multi-head attention."""
        return self.n_heads // self.n_kv_heads
