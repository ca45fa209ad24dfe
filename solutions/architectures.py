"""The architecture registry: which code runs a model, chosen in one place by the model's class.

The course builds two architectures: chapter 1's GPT-2 (`DemoTransformer`) and chapter 7's
today's block (`LlamaTransformer`). Each computes the same passes in its own way: the plain
forward (`model(tokens)`), chapter 4's cached pass (`forward_with_cache`), chapter 5's pass on
a static cache (`forward_static`) and chapter 8's runner over the paged cache. Code that serves
any model (the samplers of chapters 4 to 6, the engine, the server, the benchmarks) asks this
registry for the pass of the model it holds, as vLLM's model registry maps an architecture's
name to its model class (vllm/model_executor/models/registry.py) and HF's auto classes map a
config's `model_type` to a model (transformers' `AutoModelForCausalLM`).

`forward_with_cache` and `forward_static` below keep chapters 4 and 5's contracts and names, for
any model: a module that serves any model imports them from here, and a notebook's cells, which
call those names, call the chapter's own functions instead (chapter 4's notebook holds chapter
4's `forward_with_cache`). Chapters 4 and 5 never name chapter 7's model; chapter 7's passes
import chapter 4's and 5's helpers, never the reverse; this module imports every pass, and no
pass imports it: no circle.

Converting to and from Hugging Face's classes is the registry's other half. It lives in
utils/convert.py (`HF_CONVERSIONS`, keyed by `Architecture.hf_model_type`), because the
HF <-> course tables have their home there and `solutions` imports nothing from `utils`.

Adding a third architecture touches the registry and that architecture's own files, nothing
else. For a Qwen-style block (Qwen3: Llama's block with an RMSNorm on each head's queries and
keys before they are turned), in ../shared/DESIGN.md's terms:

- solutions/qwen_config.py: its config (Llama's fields, and what it adds);
- solutions/qwen.py: the model, one concept: an attention whose `rotated_qkv` normalises each
  head's queries and keys before RoPE, the block and the model, built from chapter 7's parts;
- its passes: chapter 7's cached, static and paged passes (llama_cache.py, llama_static.py,
  llama_paged.py) reach attention only through `block.attn.rotated_qkv` and `block.attn.attend`,
  so they run it as they are; a block that differs elsewhere brings its own pass files, as
  Llama brings those three;
- solutions/architectures.py: one `Architecture(...)` in `ARCHITECTURES`;
- utils/convert.py: its HF tables (config fields, weight names: `q_norm`, `k_norm`) and one
  `HF_CONVERSIONS` line (HF's `Qwen3ForCausalLM`);
- tests/machinery/: its tests against HF's model on a saved random-weight stand-in; and, only
  if a chapter teaches it, its chapter section, graded tests and mutants; only if the course
  ships one, its recipe and model card in utils/recipe.py.

Not the samplers and generators (solutions/cached_sampling.py ... fast_speculative.py), the
engine, the server, utils/models.py (loading and saving) or utils/serving.py: they ask the
registry. (benchmarks/serving.py's profile names the GPT-2 and Llama modules it times; a third
architecture's profile would name its own.)
"""

from collections.abc import Callable
from dataclasses import dataclass

from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions import cached_model, static_cache
from solutions.config import Config
from solutions.kv_cache import KeyValueCache
from solutions.llama import LlamaTransformer
from solutions.llama_cache import llama_forward_with_cache
from solutions.llama_config import LlamaConfig
from solutions.llama_paged import LlamaModelRunner
from solutions.llama_static import llama_forward_static
from solutions.model import DemoTransformer
from solutions.model_runner import GPT2ModelRunner
from solutions.static_cache import StaticKeyValueCache
from solutions.train import tie_embeddings


@dataclass(frozen=True)
class Architecture:
    """One architecture's code: its model and config classes, and each pass as a function of the
    model (or, for chapter 8, the runner class the engine builds from the model)."""

    hf_model_type: str  # HF's config.json `model_type`: the key of utils/convert.py's tables
    model: type[nn.Module]  # its plain pass is the model's own forward: model(tokens)
    config: type
    tied: Callable[..., nn.Module]  # a new model for a config, its unembedding its embedding
    forward_with_cache: Callable  # chapter 4's: (model, tokens, cache, ...) -> logits, cache
    forward_static: Callable  # chapter 5's: (model, tokens, cache, slots, positions, real)
    runner: type  # chapter 8's: runner(model).forward(cache, inputs, logits_at) -> logits


def _tied_gpt2(cfg: Config) -> DemoTransformer:
    return tie_embeddings(DemoTransformer(cfg))


def _tied_llama(cfg: LlamaConfig) -> LlamaTransformer:
    return LlamaTransformer(cfg, tie_embeddings=True)


ARCHITECTURES = (
    Architecture(
        "gpt2", DemoTransformer, Config, _tied_gpt2,
        cached_model.forward_with_cache, static_cache.forward_static, GPT2ModelRunner,
    ),
    Architecture(
        "llama", LlamaTransformer, LlamaConfig, _tied_llama,
        llama_forward_with_cache, llama_forward_static, LlamaModelRunner,
    ),
)  # fmt: skip

# Each model class and each config class to its architecture, for a lookup by class.
_BY_CLASS = {cls: arch for arch in ARCHITECTURES for cls in (arch.model, arch.config)}


def architecture_of(model_or_config) -> Architecture:
    """The architecture of a course model or of its config, by class (a subclass of a registered
    class is that architecture, unless it is registered itself)."""
    for cls in type(model_or_config).__mro__:  # most specific class first
        if cls in _BY_CLASS:
            return _BY_CLASS[cls]
    known = ", ".join(f"{a.model.__name__} ({a.config.__name__})" for a in ARCHITECTURES)
    raise ValueError(f"model must be one of the architectures the course runs ({known}), or "
                     f"its config; got {type(model_or_config).__name__}")  # fmt: skip


def architecture_named(hf_model_type: str | None) -> Architecture:
    """The architecture of an HF config's `model_type` ("gpt2", "llama"), or a ValueError."""
    for arch in ARCHITECTURES:
        if arch.hf_model_type == hf_model_type:
            return arch
    known = sorted(a.hf_model_type for a in ARCHITECTURES)
    raise ValueError(f"model_type must be one of {known} (the architectures the course builds), "
                     f"got {hf_model_type!r}")  # fmt: skip


# ---- the passes, for any model: what the callers that serve any model import ----------------


def forward_with_cache(
    model: nn.Module,
    tokens: Int[Tensor, "batch new"],
    cache: KeyValueCache | None = None,
    attention_mask: Bool[Tensor, "batch new"] | None = None,
    positions: Int[Tensor, "new"] | None = None,
    allowed: Bool[Tensor, "new all"] | None = None,
) -> tuple[Float[Tensor, "batch new d_vocab"], KeyValueCache]:
    """Chapter 4's `forward_with_cache` for the model's architecture: the same contract."""
    cached = architecture_of(model).forward_with_cache
    return cached(model, tokens, cache, attention_mask, positions, allowed)


def forward_static(
    model: nn.Module,
    tokens: Int[Tensor, "batch new"],
    cache: StaticKeyValueCache,
    slots: Int[Tensor, "new"],
    positions: Int[Tensor, "batch new"],
    real: Bool[Tensor, "batch new"] | None = None,
) -> Float[Tensor, "batch new d_vocab"]:
    """Chapter 5's `forward_static` for the model's architecture: the same contract. The lookup
    reads the model's class only, which a compiled step checks once (a guard), not each step."""
    static = architecture_of(model).forward_static
    return static(model, tokens, cache, slots, positions, real)


def model_runner(model: nn.Module):
    """Chapter 8's runner for the model's architecture, built for this model."""
    return architecture_of(model).runner(model)
