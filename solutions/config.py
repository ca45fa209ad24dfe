"""The hyper-parameters of a GPT-2 style model, named as in transformer-lens."""

from dataclasses import dataclass

from solutions import checks


@dataclass
class Config:
    d_model: int = 768  # width of the residual stream
    layer_norm_eps: float = 1e-5  # added to the variance inside the square root
    d_vocab: int = 50257  # number of tokens the model knows
    init_range: float = 0.02  # std of the normal initialisation of every weight
    n_ctx: int = 1024  # longest sequence the model can read (number of learned positions)
    d_head: int = 64  # width of one attention head's queries, keys and values
    d_mlp: int = 3072  # hidden width of the MLP (4 * d_model in GPT-2)
    n_heads: int = 12
    n_layers: int = 12

    def __post_init__(self) -> None:
        for name in ("d_model", "d_vocab", "n_ctx", "d_head", "d_mlp", "n_heads", "n_layers"):
            checks.integer(f"Config.{name}", getattr(self, name), low=1)
        checks.positive("Config.layer_norm_eps", self.layer_norm_eps)
        checks.positive("Config.init_range", self.init_range)

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads: GPT-2 has one per query head. (Chapter 7's grouped-query attention
        shares each among several; a cache sized by this field holds either model.)"""
        return self.n_heads
