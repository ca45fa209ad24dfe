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

Chapter 2 trains it:

    dataset.py     TokenWindows: a token stream cut into (input, target) windows
    schedule.py    lr_factor: linear warm-up, then cosine decay
    train.py       lm_loss, train_step, evaluate and the training loop
    bigram.py      BigramLM: the baseline to beat

Chapter 3 generates text with it:

    sampling.py    greedy, temperature, frequency penalty, top-k, top-p; TransformerSampler
    beams.py       Beams and beam_search, with no-repeat n-grams

Chapter 4 makes generation fast:

    kv_cache.py        KeyValueCache: every layer's keys and values of the positions seen
    cached_model.py    forward_with_cache: compute the new positions only
    cached_sampling.py CachedTransformerSampler, sliding the window past n_ctx
    cached_beams.py    CachedBeams: the cache follows the beams
    batched.py         left_pad and generate_batch: many prompts at once

Chapter 5 takes out the fixed cost of a step:

    step_cost.py       what a decoding step costs: dispatches, arithmetic, bytes read
    static_cache.py    StaticKeyValueCache: allocated once for n_ctx, written in place
    fast_sampling.py   decode_step and FastTransformerSampler: a step of one shape, compiled,
                       sampling on the device
    cuda_graphs.py     a decoding step recorded once as a CUDA graph and replayed
    int8.py            weight-only int8, one scale per output channel

Chapter 6 speeds it up again without changing what it samples:

    speculative.py            rejection sampling: one distribution, then a batch of k drafts
    drafters.py               who guesses: n-gram prompt lookup, a draft model with its cache
    speculative_generation.py the round, and speculative_generate
    gumbel.py                 the Gumbel-max trick; how often two samplers agree
    lookahead.py              lookahead decoding: Jacobi iteration, the one-pass layout, n-grams
    fast_speculative.py       speculative decoding on chapter 5's static caches, compiled

Chapter 7 builds today's block (Llama, Mistral, SmolLM2) and checks it against HF's Llama:

    llama_config.py    LlamaConfig: n_kv_heads, rope_theta, rms_norm_eps (SmolLM2-135M's defaults)
    rmsnorm.py         RMSNorm: no mean, no bias; the mean square in float32
    rope.py            rotary embeddings: rope_cos_sin, apply_rope (half-split, HF's layout), and
                       the paper's interleaved layout with the permutation between the two
    swiglu.py          SwiGLU: down(silu(gate(x)) * up(x))
    gqa.py             expand_kv (HF's repeat_kv) and GroupedQueryAttention
    llama.py           LlamaBlock and LlamaTransformer
    llama_cache.py     llama_forward_with_cache: chapter 4's cache, keys stored after rotation
    llama_static.py    chapter 5's static cache for the same model
    architectures.py   the registry: each model class to its passes (plain, chapter 4's cache,
                       chapter 5's static cache, chapter 8's runner); what any-model code asks

Chapter 8 serves many requests at once (vLLM's and nano-vllm's decomposition):

    sampling_params.py SamplingParams: one request's sampling settings
    request.py         Request: a request's record (its tokens, computed tokens, block table)
    paged_attention.py the model runner: one flattened step through block tables
    model_runner.py    GPT-2's runner: forward_paged with each layer's fused projection
    llama_paged.py     the Llama model's runner: keys rotated before they are written
    block_pool.py      BlockPool: reference counts, the free queue, prefix names
    kv_cache_manager.py KVCacheManager: prefix-cache hits and a request's blocks
    scheduler.py       Scheduler: continuous batching, chunked prefill, preemption; it alone
                       advances, stops and finishes a request
    engine.py          LLMEngine: add_request, step (schedule, run, sample, update), abort

Chapter 9 keeps the output to a constraint (outlines' index):

    token_bytes.py          token_bytes: each token id's exact bytes (GPT-2's byte map)
    byte_dfa.py             regex_to_byte_dfa: a regex as a DFA over bytes (from interegular)
    token_index.py          walk, TokenIndex (each state's allowed tokens), Guide (a request's)
    token_mask.py           token_mask, mask_logits: -inf outside the allowed set
    constrained_sampling.py ConstrainedSampler: chapter 3's sampler with its logits masked

Chapter 10's kernels live in solutions/kernels/; importing this package first decides how they
run (triton_mode.py), before anything else can import Triton.
"""

from solutions import triton_mode  # noqa: F401, I001  (first: before anything imports triton)

from solutions.attention import Attention
from solutions.batched import generate_batch, left_pad
from solutions.beams import Beams, beam_search
from solutions.block import TransformerBlock
from solutions.cached_beams import CachedBeams
from solutions.architectures import forward_with_cache  # chapter 4's pass, for any model
from solutions.cached_sampling import CachedTransformerSampler
from solutions.config import Config
from solutions.embed import Embed, PosEmbed
from solutions.kv_cache import KeyValueCache
from solutions.layernorm import LayerNorm
from solutions.mlp import MLP
from solutions.model import DemoTransformer
from solutions.sampling import TransformerSampler, sample_next_token
from solutions.tokens import token_strings
from solutions.unembed import Unembed

__all__ = [
    "Attention",
    "Beams",
    "CachedBeams",
    "CachedTransformerSampler",
    "Config",
    "DemoTransformer",
    "Embed",
    "KeyValueCache",
    "LayerNorm",
    "MLP",
    "PosEmbed",
    "TransformerBlock",
    "TransformerSampler",
    "Unembed",
    "beam_search",
    "forward_with_cache",
    "generate_batch",
    "left_pad",
    "sample_next_token",
    "token_strings",
]
