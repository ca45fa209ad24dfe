"""Weights between the course's models and HF's: DemoTransformer (transformer-lens naming) and
HF GPT-2, then chapter 7's LlamaTransformer and HF Llama, then the registry's HF half
(`HF_CONVERSIONS`: `to_hf` and `from_hf` for any architecture the course builds).

HF's GPT-2 stores each attention's Q, K and V in one `Conv1D` (`c_attn`, weight
[d_model, 3 * d_model], applied as x @ W) with the heads side by side; the course keeps one
[n_heads, d_model, d_head] matrix per projection. Everything else is a rename.

The configs map field by field too: CONFIG_FIELDS is the one table, read in both directions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import einops
import torch
from torch import Tensor

from solutions.architectures import architecture_named, architecture_of
from solutions.config import Config

if TYPE_CHECKING:
    from transformers import GPT2Config

# (HF GPT2Config attribute, course Config field) holding the same number, read both ways by
# `config_from_hf` and `hf_config`. d_head has no HF attribute: HF derives it as
# n_embd // n_head. HF's n_inner may be None, which means 4 * n_embd.
CONFIG_FIELDS = [
    ("n_embd", "d_model"),
    ("layer_norm_epsilon", "layer_norm_eps"),
    ("vocab_size", "d_vocab"),
    ("initializer_range", "init_range"),
    ("n_positions", "n_ctx"),
    ("n_inner", "d_mlp"),
    ("n_head", "n_heads"),
    ("n_layer", "n_layers"),
]


def config_from_hf(config: GPT2Config) -> Config:
    """The course's Config for an HF GPT2Config."""
    fields = {ours: getattr(config, theirs) for theirs, ours in CONFIG_FIELDS}
    if fields["d_mlp"] is None:
        fields["d_mlp"] = 4 * config.n_embd
    return Config(**fields, d_head=config.n_embd // config.n_head)


def hf_config(cfg: Config) -> GPT2Config:
    """The HF GPT2Config for a course Config: GPT-2's activation, no dropout (the course's
    model has none), tied embeddings, and <|endoftext|> (id 0 in the course's tokenizers) as
    both bos and eos."""
    from transformers import GPT2Config

    if cfg.n_heads * cfg.d_head != cfg.d_model:
        raise ValueError("HF GPT-2 needs n_heads * d_head == d_model")
    return GPT2Config(
        **{theirs: getattr(cfg, ours) for theirs, ours in CONFIG_FIELDS},
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )


# Per-block weights with the same layout in both namings (HF's Conv1D stores [in, out], as
# the course's MLP does): (HF name, HookedTransformer name).
SAME_IN_BOTH = [
    ("mlp.c_fc.weight", "mlp.W_in"),
    ("mlp.c_fc.bias", "mlp.b_in"),
    ("mlp.c_proj.weight", "mlp.W_out"),
    ("mlp.c_proj.bias", "mlp.b_out"),
    ("ln_1.weight", "ln1.w"),
    ("ln_1.bias", "ln1.b"),
    ("ln_2.weight", "ln2.w"),
    ("ln_2.bias", "ln2.b"),
]


def hf_to_demo(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """HF GPT2LMHeadModel state dict -> DemoTransformer state dict (untied W_U = W_E^T)."""
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {
        "embed.W_E": sd["wte.weight"],
        "pos_embed.W_pos": sd["wpe.weight"],
        "ln_final.w": sd["ln_f.weight"],
        "ln_final.b": sd["ln_f.bias"],
        "unembed.W_U": sd.get("lm_head.weight", sd["wte.weight"]).T,
        "unembed.b_U": torch.zeros(cfg.d_vocab),
    }
    for layer in range(cfg.n_layers):
        hf, tl = f"h.{layer}.", f"blocks.{layer}."
        W_q, W_k, W_v = sd[hf + "attn.c_attn.weight"].split(cfg.d_model, dim=1)
        b_q, b_k, b_v = sd[hf + "attn.c_attn.bias"].split(cfg.d_model, dim=0)
        for name, W, b in (("Q", W_q, b_q), ("K", W_k, b_k), ("V", W_v, b_v)):
            out[tl + f"attn.W_{name}"] = einops.rearrange(W, "d (h e) -> h d e", h=cfg.n_heads)
            out[tl + f"attn.b_{name}"] = einops.rearrange(b, "(h e) -> h e", h=cfg.n_heads)
        W_o = sd[hf + "attn.c_proj.weight"]
        out[tl + "attn.W_O"] = einops.rearrange(W_o, "(h e) d -> h e d", h=cfg.n_heads)
        out[tl + "attn.b_O"] = sd[hf + "attn.c_proj.bias"]
        for hf_name, tl_name in SAME_IN_BOTH:
            out[tl + tl_name] = sd[hf + hf_name]
    return {k: v.detach().clone() for k, v in out.items()}


def demo_to_hf(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """DemoTransformer state dict -> HF GPT2LMHeadModel state dict (tied lm_head).

    A model with its own W_U must have W_U == W_E^T and b_U == 0: HF GPT-2 has neither an
    untied unembedding nor an unembedding bias, and dropping them silently would change it.
    """
    if "unembed.W_U" in sd and not torch.equal(sd["unembed.W_U"], sd["embed.W_E"].T):
        raise ValueError("unembed.W_U must equal embed.W_E.T: HF GPT-2 ties them")
    if "unembed.b_U" in sd and sd["unembed.b_U"].abs().max() > 0:
        raise ValueError("unembed.b_U must be zero: HF GPT-2 has no unembedding bias")
    out = {
        "transformer.wte.weight": sd["embed.W_E"],
        "transformer.wpe.weight": sd["pos_embed.W_pos"],
        "transformer.ln_f.weight": sd["ln_final.w"],
        "transformer.ln_f.bias": sd["ln_final.b"],
        "lm_head.weight": sd["embed.W_E"],
    }
    for layer in range(cfg.n_layers):
        hf, tl = f"transformer.h.{layer}.", f"blocks.{layer}."
        W = [einops.rearrange(sd[tl + f"attn.W_{n}"], "h d e -> d (h e)") for n in "QKV"]
        b = [einops.rearrange(sd[tl + f"attn.b_{n}"], "h e -> (h e)") for n in "QKV"]
        out[hf + "attn.c_attn.weight"] = torch.cat(W, dim=1)
        out[hf + "attn.c_attn.bias"] = torch.cat(b, dim=0)
        out[hf + "attn.c_proj.weight"] = einops.rearrange(sd[tl + "attn.W_O"], "h e d -> (h e) d")
        out[hf + "attn.c_proj.bias"] = sd[tl + "attn.b_O"]
        for hf_name, tl_name in SAME_IN_BOTH:
            out[hf + hf_name] = sd[tl + tl_name]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def to_hf_model(model, cfg: Config):
    """A GPT2LMHeadModel holding the weights of a (possibly tied) DemoTransformer."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(hf_config(cfg)).eval()
    state = model.state_dict()
    if "unembed.W_U" not in state:  # a tied model (solutions.train.tie_embeddings)
        state = {k: v for k, v in state.items() if not k.startswith("unembed.")}
    missing, unexpected = hf.load_state_dict(demo_to_hf(state, cfg), strict=False)
    if unexpected or [k for k in missing if not k.endswith(".attn.bias")]:
        raise ValueError(f"weights do not fit GPT-2: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf


def demo_from_hf(hf):
    """The course's DemoTransformer with the weights of an HF GPT2LMHeadModel."""
    from solutions.model import DemoTransformer

    cfg = config_from_hf(hf.config)
    model = DemoTransformer(cfg)
    model.load_state_dict(hf_to_demo(hf.state_dict(), cfg))
    return model.eval()


# ---- Llama (chapter 7): HF LlamaForCausalLM <-> the course's LlamaTransformer ----------------

# (HF LlamaConfig attribute, course LlamaConfig field) holding the same number.
LLAMA_CONFIG_FIELDS = [
    ("hidden_size", "d_model"),
    ("vocab_size", "d_vocab"),
    ("initializer_range", "init_range"),
    ("max_position_embeddings", "n_ctx"),
    ("head_dim", "d_head"),
    ("intermediate_size", "d_mlp"),
    ("num_attention_heads", "n_heads"),
    ("num_key_value_heads", "n_kv_heads"),
    ("num_hidden_layers", "n_layers"),
    ("rms_norm_eps", "rms_norm_eps"),
]


def rope_theta_of(config) -> float:
    """The base of the rotary angles, wherever the config keeps it: `rope_parameters` (a dict,
    transformers 5) or `rope_theta` (older configs, SmolLM2's among them). Any RoPE scaling
    (Llama 3.1's "llama3", "linear", "dynamic", "yarn", ...) changes the angles and is refused."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise ValueError(
            f"rope_parameters.rope_type must be 'default' (no scaling), got {kind!r}: the course's "
            "rope_cos_sin implements plain RoPE only"
        )
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("config has neither rope_parameters['rope_theta'] nor rope_theta")
    return float(theta)


def llama_config_from_hf(config):
    """The course's LlamaConfig for an HF LlamaConfig, refusing what the course's model does not
    compute (a ValueError naming the field) rather than computing something else silently."""
    from solutions.llama_config import LlamaConfig

    refused = {
        "attention_bias": False,  # q/k/v/o biases (Qwen 2 has q/k/v biases)
        "mlp_bias": False,
        "hidden_act": "silu",  # GeGLU (Gemma) gates with GELU
    }
    for field, wanted in refused.items():
        got = getattr(config, field, wanted)
        if got != wanted:
            raise ValueError(f"{field} must be {wanted!r} for the course's Llama, got {got!r}")
    for field in ("sliding_window", "layer_types"):
        if getattr(config, field, None) not in (None, []):
            raise ValueError(f"{field} is not implemented by the course's Llama (full causal "
                             f"attention only), got {getattr(config, field)!r}")  # fmt: skip
    fields = {ours: getattr(config, theirs, None) for theirs, ours in LLAMA_CONFIG_FIELDS}
    if fields["d_head"] is None:
        fields["d_head"] = config.hidden_size // config.num_attention_heads
    if fields["n_kv_heads"] is None:
        fields["n_kv_heads"] = config.num_attention_heads
    return LlamaConfig(**fields, rope_theta=rope_theta_of(config))


def hf_llama_config(cfg, tie_embeddings: bool = True):
    """The HF LlamaConfig for a course LlamaConfig: SiLU, no biases, plain RoPE, and
    <|endoftext|> (id 0 in the course's tokenizers) as bos and eos."""
    from transformers import LlamaConfig as HFLlamaConfig

    return HFLlamaConfig(
        **{theirs: getattr(cfg, ours) for theirs, ours in LLAMA_CONFIG_FIELDS},
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=tie_embeddings,
        bos_token_id=0,
        eos_token_id=0,
    )


def hf_to_llama(sd: dict[str, Tensor], cfg) -> dict[str, Tensor]:
    """HF LlamaForCausalLM state dict -> LlamaTransformer state dict. HF's nn.Linear weights are
    [out, in], applied as x @ W.T; the course keeps [in, out] (and heads apart) as chapter 1 does.
    A tied model has no lm_head entry (or one equal to the embedding): no unembed weight then."""
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    out = {"embed.W_E": sd["embed_tokens.weight"], "ln_final.w": sd["norm.weight"]}
    head = sd.get("lm_head.weight")
    if head is not None and not torch.equal(head, sd["embed_tokens.weight"]):
        out["unembed.W_U"] = head.T
    for layer in range(cfg.n_layers):
        hf, ours = f"layers.{layer}.", f"blocks.{layer}."
        for proj, name in (("q_proj", "W_Q"), ("k_proj", "W_K"), ("v_proj", "W_V")):
            W = sd[hf + f"self_attn.{proj}.weight"]  # [heads * d_head, d_model]
            out[ours + f"attn.{name}"] = einops.rearrange(W, "(h e) d -> h d e", e=cfg.d_head)
        W_o = sd[hf + "self_attn.o_proj.weight"]  # [d_model, n_heads * d_head]
        out[ours + "attn.W_O"] = einops.rearrange(W_o, "d (h e) -> h e d", e=cfg.d_head)
        out[ours + "mlp.W_gate"] = sd[hf + "mlp.gate_proj.weight"].T
        out[ours + "mlp.W_up"] = sd[hf + "mlp.up_proj.weight"].T
        out[ours + "mlp.W_down"] = sd[hf + "mlp.down_proj.weight"].T
        out[ours + "ln1.w"] = sd[hf + "input_layernorm.weight"]
        out[ours + "ln2.w"] = sd[hf + "post_attention_layernorm.weight"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def llama_to_hf(sd: dict[str, Tensor], cfg) -> dict[str, Tensor]:
    """LlamaTransformer state dict -> HF LlamaForCausalLM state dict (the inverse of
    `hf_to_llama`; lm_head is the embedding when the model is tied)."""
    out = {
        "model.embed_tokens.weight": sd["embed.W_E"],
        "model.norm.weight": sd["ln_final.w"],
        "lm_head.weight": sd["unembed.W_U"].T if "unembed.W_U" in sd else sd["embed.W_E"],
    }
    for layer in range(cfg.n_layers):
        hf, ours = f"model.layers.{layer}.", f"blocks.{layer}."
        for proj, name in (("q_proj", "W_Q"), ("k_proj", "W_K"), ("v_proj", "W_V")):
            W = sd[ours + f"attn.{name}"]
            out[hf + f"self_attn.{proj}.weight"] = einops.rearrange(W, "h d e -> (h e) d")
        out[hf + "self_attn.o_proj.weight"] = einops.rearrange(sd[ours + "attn.W_O"],
                                                                "h e d -> d (h e)")  # fmt: skip
        out[hf + "mlp.gate_proj.weight"] = sd[ours + "mlp.W_gate"].T
        out[hf + "mlp.up_proj.weight"] = sd[ours + "mlp.W_up"].T
        out[hf + "mlp.down_proj.weight"] = sd[ours + "mlp.W_down"].T
        out[hf + "input_layernorm.weight"] = sd[ours + "ln1.w"]
        out[hf + "post_attention_layernorm.weight"] = sd[ours + "ln2.w"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def to_hf_llama(model):
    """A LlamaForCausalLM holding the weights of a course LlamaTransformer."""
    from transformers import LlamaForCausalLM

    state = model.state_dict()
    tied = "unembed.W_U" not in state
    hf = LlamaForCausalLM(hf_llama_config(model.cfg, tie_embeddings=tied)).eval()
    missing, unexpected = hf.load_state_dict(llama_to_hf(state, model.cfg), strict=False)
    if unexpected or missing:
        raise ValueError(f"weights do not fit Llama: missing {missing}, unexpected {unexpected}")
    if tied:
        hf.tie_weights()
    return hf


def llama_from_hf(hf):
    """The course's LlamaTransformer with the weights of an HF LlamaForCausalLM."""
    from solutions.llama import LlamaTransformer

    cfg = llama_config_from_hf(hf.config)
    sd = hf_to_llama(hf.state_dict(), cfg)
    model = LlamaTransformer(cfg, tie_embeddings="unembed.W_U" not in sd)
    model.load_state_dict(sd)
    return model.eval()


# ---- The architecture registry's HF half -----------------------------------------------------
# solutions/architectures.py picks each architecture's passes by the model's class; converting to
# and from HF's classes is here (`solutions` imports nothing from `utils`), keyed by the HF
# config's `model_type`, which the registry holds for each architecture (`hf_model_type`).


@dataclass(frozen=True)
class HFConversion:
    hf_class: str  # the transformers class that loads such a checkpoint
    to_hf: Callable  # the course's model -> an HF model with its weights
    from_hf: Callable  # an HF model -> the course's model with its weights, in eval mode


HF_CONVERSIONS = {
    "gpt2": HFConversion("GPT2LMHeadModel", lambda m: to_hf_model(m, m.cfg), demo_from_hf),
    "llama": HFConversion("LlamaForCausalLM", to_hf_llama, llama_from_hf),
}


def hf_conversion(model_type: str | None) -> HFConversion:
    """The conversion for an HF config's `model_type`, or a ValueError naming the known ones."""
    return HF_CONVERSIONS[architecture_named(model_type).hf_model_type]


def to_hf(model):
    """An HF model (GPT2LMHeadModel, LlamaForCausalLM, ...) holding a course model's weights."""
    return HF_CONVERSIONS[architecture_of(model).hf_model_type].to_hf(model)


def from_hf(hf):
    """The course's model (of the architecture the HF config names) with an HF model's weights."""
    return hf_conversion(getattr(hf.config, "model_type", None)).from_hf(hf)
