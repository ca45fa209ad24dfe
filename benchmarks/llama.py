"""Today's block against GPT-2's at matched parameters: a cached decoding step, chapter 5's fast
sampler, and the bytes a KV cache keeps per token.

    python benchmarks/llama.py [--gpt2 shakespeare] [--llama shakespeare-llama] [--runs 7]
                               [--threads 1] [--quick]

The two shipped main models have the same width, depth, context and tokenizer, and nearly the
same number of parameters (the Llama model's MLP is narrowed to 624 so that its three matrices
weigh what GPT-2's two do). What differs is the block: RMSNorm, rotary positions, SwiGLU and
grouped-query attention (2 key/value heads for 6 query heads). Everything is timed in one
process, the methods interleaved run by run (a busy spell of the machine hits both models), each
ratio the median over runs of the ratio within a run. Prints one JSON object:

- `cached_step`: chapter 4's `forward_with_cache`, one new token after `--position` cached
  positions: microseconds per step (medians) and the ratio Llama / GPT-2, with the PyTorch
  operations each step dispatches (counted by `torch.profiler`): on a model this small a step's
  time is mostly per-operation overhead, so the count is where a difference comes from;
- `fast_sampler`: chapter 5's `FastTransformerSampler`, greedy, one 1-token prompt, n_ctx - 1
  new tokens, eager and (with a C++ compiler, which Inductor needs) compiled: tokens/s and the
  ratios; every method must give chapter 4's tokens (checked), and the compiled steps'
  recompilations are counted from dynamo's cache;
- `kv_cache`: bytes per cached token of each model, measured from the cache tensors of a
  prefill (chapter 4's cache) and from the static cache's buffers (chapter 5's), and their ratio;
- `goals`: the Llama step at most 1.2x GPT-2's (rotary embeddings add work that GPT-2's learned
  positions do not), and the KV cache n_heads / n_kv_heads = 3x smaller, each met or not.

`--quick` is the smoke test of tests/machinery/benchmarks/test_llama_benchmark.py: tiny settings,
and dynamo's "eager" backend instead of Inductor (nothing is built).
"""

from __future__ import annotations

import argparse
import time

import einops
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from solutions.architectures import forward_with_cache
from solutions.cached_sampling import CachedTransformerSampler
from solutions.fast_sampling import FastTransformerSampler, decode_step, inductor_available
from solutions.gqa import expand_kv
from solutions.rope import apply_rope, rope_cos_sin
from solutions.static_cache import StaticKeyValueCache
from solutions.step_cost import profile_ops
from utils.models import load_model
from utils.records import add_record_options, emit, goal, machine, rate, us_each
from utils.timing import interleaved_runs, ratio_within_runs, sig

PROMPT = "\n"  # one token
MODELS = ("gpt2", "llama")


def parameters(model) -> int:
    """Parameters as the checkpoint counts them: a tied unembedding (chapter 1's DemoTransformer
    keeps a copy of the embedding's transpose, and a zero bias) is the embedding, not more."""
    params = dict(model.named_parameters())
    tied = []
    if "unembed.W_U" in params and torch.equal(params["unembed.W_U"], params["embed.W_E"].T):
        tied.append("unembed.W_U")
        if "unembed.b_U" in params and not params["unembed.b_U"].any():
            tied.append("unembed.b_U")
    return sum(p.numel() for name, p in params.items() if name not in tied)


def cached_step(models: dict, position: int, runs: int, calls: int) -> dict:
    """One decoding step of chapter 4's cached forward pass, after `position` cached positions,
    for each model: `calls` steps from the same cache per timed call, interleaved runs."""
    methods, ops, by_name = {}, {}, {}
    for name, (model, _) in models.items():
        tokens = torch.randint(
            0, model.cfg.d_vocab, (1, position + 1), generator=torch.Generator().manual_seed(0)
        )
        with torch.inference_mode():
            _, cache = forward_with_cache(model, tokens[:, :position])

        def step(model=model, cache=cache, token=tokens[:, position:]):
            return forward_with_cache(model, token, cache)

        def block(step=step, calls=calls):
            with torch.inference_mode():
                for _ in range(calls):
                    step()

        methods[name] = block
        with torch.inference_mode():
            ops[name], rows = profile_ops(step, repeats=3)
        by_name[name] = {op: calls for op, calls, _ in rows}
    methods.update(llama_parts(models["llama"][0], position, calls))
    times, _ = interleaved_runs(methods, runs)
    # Where the extra operations are: per operation name, Llama's count minus GPT-2's.
    names = set(by_name["gpt2"]) | set(by_name["llama"])
    more = {op: by_name["llama"].get(op, 0) - by_name["gpt2"].get(op, 0) for op in names}
    largest = sorted(more, key=lambda op: (-abs(more[op]), op))[:12]
    us = {name: sig(us_each(t, calls, digits=None), 4) for name, t in times.items()}
    return {
        "position": position,
        "calls_per_run": calls,
        "us_per_step": {name: us[name] for name in models},
        "llama_minus_gpt2_us": round(us["llama"] - us["gpt2"], 1),
        # Two of the Llama step's own parts, alone, for all its layers (in the same runs).
        "llama_parts_us_per_step": {name: us[name] for name in us if name not in models},
        "llama_over_gpt2": ratio_within_runs(times, "gpt2", "llama"),
        "aten_ops_per_step": {name: int(n) for name, n in ops.items()},
        "llama_minus_gpt2_ops_by_name": {op.removeprefix("aten::"): more[op] for op in largest},
    }


def llama_parts(model, position: int, calls: int) -> dict:
    """Timed calls of parts of a Llama step, each done for every layer `calls` times: two that
    GPT-2 has no counterpart for, the rotary embedding (a position's angles, then queries and
    keys turned) and the key/value heads repeated for their query groups (`expand_kv`); and the
    attention's four projections written both ways."""
    cfg = model.cfg
    position_ = torch.tensor([[position]])
    q = torch.randn(1, cfg.n_heads, 1, cfg.d_head)
    k = torch.randn(1, cfg.n_kv_heads, 1, cfg.d_head)
    cached = torch.randn(1, cfg.n_kv_heads, position + 1, cfg.d_head)

    def rotary():
        with torch.inference_mode():
            for _ in range(calls * cfg.n_layers):
                cos, sin = rope_cos_sin(position_, cfg.d_head, cfg.rope_theta)
                apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def repeat_kv():
        with torch.inference_mode():
            for _ in range(calls * cfg.n_layers):
                expand_kv(cached, cfg.group_size), expand_kv(cached, cfg.group_size)

    # The four products of a layer's attention (Q, K, V, O) written with einops.einsum, and as
    # chapter 4's GPT-2 step writes them (a matrix product on the flattened rows): the same
    # arithmetic, different dispatch. (GroupedQueryAttention.rotated_qkv now projects the second
    # way; attend's output projection is still an einops.einsum.)
    attn = model.blocks[0].attn
    x = torch.randn(1, 1, cfg.d_model)
    z = torch.randn(1, cfg.n_heads, 1, cfg.d_head)

    def einsums():
        with torch.inference_mode():
            for _ in range(calls * cfg.n_layers):
                for W in (attn.W_Q, attn.W_K, attn.W_V):
                    einops.einsum(x, W, "b p d, h d e -> b h p e")
                einops.einsum(z, attn.W_O, "b h p e, h e d -> b p d")

    def matmuls():
        with torch.inference_mode():
            for _ in range(calls * cfg.n_layers):
                rows = x.flatten(0, 1)
                for W in (attn.W_Q, attn.W_K, attn.W_V):
                    (rows @ W).unflatten(1, x.shape[:2]).transpose(0, 1)
                torch.einsum("bhpe,hed->bpd", z, attn.W_O)

    return {
        "rotary": rotary,
        "expand_kv": repeat_kv,
        "projections_einops": einsums,
        "projections_as_gpt2_step": matmuls,
    }


def fast_sampler(models: dict, runs: int, new_tokens: int | None, backend) -> dict:
    """Chapter 5's FastTransformerSampler on each model, greedy: eager and compiled with
    `backend` (True: Inductor; a string: that dynamo backend; None: not compiled)."""
    methods, expected, compile_seconds = {}, {}, {}
    torch._dynamo.reset()  # dynamo's cache then holds this benchmark's compilations only
    for name, (model, tokenizer) in models.items():
        ids = tokenizer.encode(PROMPT)
        new = new_tokens or model.cfg.n_ctx - len(ids)
        expected[name] = CachedTransformerSampler(model, tokenizer).sample(
            ids, new, temperature=0.0, stop_at_eos=False
        )
        eager = FastTransformerSampler(model, tokenizer, compile=False)
        methods[f"{name}_eager"] = lambda s=eager, ids=ids, new=new: s.sample(
            ids, new, temperature=0.0, stop_at_eos=False
        )
        if backend is not None:
            fast = FastTransformerSampler(model, tokenizer, compile=backend)
            start = time.perf_counter()
            fast.sample(ids, 2, temperature=0.0)  # the first step compiles
            compile_seconds[name] = round(time.perf_counter() - start, 1)
            methods[f"{name}_compiled"] = lambda s=fast, ids=ids, new=new: s.sample(
                ids, new, temperature=0.0, stop_at_eos=False
            )
    times, _ = interleaved_runs(methods, runs)
    out = {"new_tokens": {}, "tokens_per_s": {}, "same_tokens_as_cached": {}}
    for method, seconds in times.items():
        name = method.split("_")[0]
        out["new_tokens"][name] = len(expected[name]) - 1
        out["tokens_per_s"][method] = rate(out["new_tokens"][name], seconds)
        out["same_tokens_as_cached"][method] = torch.equal(methods[method](), expected[name])
    if backend is not None:
        # One entry in dynamo's cache per compilation of the decoding step: one per model (its
        # guards differ), and any more is a recompilation during the timed generations.
        entries = len(_debug_get_cache_entry_list(decode_step.__code__))
        out["compiled"] = {
            "compile_seconds": compile_seconds,
            "decode_step_compilations": entries,
            "recompilations": entries - len(models),
        }
    out["ratios"] = {
        "llama_over_gpt2_eager": ratio_within_runs(times, "gpt2_eager", "llama_eager"),
        "llama_over_gpt2_compiled": ratio_within_runs(times, "gpt2_compiled", "llama_compiled"),
        "gpt2_compiled_over_eager": ratio_within_runs(times, "gpt2_compiled", "gpt2_eager"),
        "llama_compiled_over_eager": ratio_within_runs(times, "llama_compiled", "llama_eager"),
    }
    return out


def kv_cache_bytes(models: dict, prompt_tokens: int) -> dict:
    """Bytes a cache keeps per token, from the tensors: chapter 4's cache after a prefill of
    `prompt_tokens`, and chapter 5's static cache (its buffers hold n_ctx tokens)."""
    out = {}
    for name, (model, _) in models.items():
        tokens = torch.randint(0, model.cfg.d_vocab, (1, prompt_tokens))
        with torch.inference_mode():
            _, cache = forward_with_cache(model, tokens)
        grown = sum(t.nbytes for t in cache.keys + cache.values)
        static = StaticKeyValueCache(model.cfg, batch=1)
        fixed = sum(t.nbytes for t in static.keys + static.values)
        cfg = model.cfg
        out[name] = {
            "n_layers": cfg.n_layers,
            "kv_heads": cfg.n_kv_heads,
            "query_heads": cfg.n_heads,
            "d_head": cfg.d_head,
            "bytes_per_token": grown // prompt_tokens,
            "static_bytes_per_token": fixed // cfg.n_ctx,
        }
    out["gpt2_over_llama"] = round(
        out["gpt2"]["bytes_per_token"] / out["llama"]["bytes_per_token"], 2
    )
    return out


def bench(args) -> dict:
    torch.manual_seed(0)
    models = {"gpt2": load_model(args.gpt2), "llama": load_model(args.llama)}
    for model, _ in models.values():
        model.eval()
    gpt2_cfg, llama_cfg = models["gpt2"][0].cfg, models["llama"][0].cfg
    if (gpt2_cfg.d_model, gpt2_cfg.n_layers, gpt2_cfg.n_ctx) != (
        llama_cfg.d_model, llama_cfg.n_layers, llama_cfg.n_ctx,
    ):  # fmt: skip
        raise ValueError("the two models must share d_model, n_layers and n_ctx")
    if args.quick:
        backend, why_not = "eager", "--quick: dynamo's eager backend, nothing built"
    else:
        inductor, why_not = inductor_available()
        backend = True if inductor else None
    step = cached_step(models, args.position, args.runs, args.calls)
    fast = fast_sampler(models, args.runs, args.new_tokens, backend)
    kv = kv_cache_bytes(models, prompt_tokens=min(64, gpt2_cfg.n_ctx))
    ratio_kv = llama_cfg.n_heads / llama_cfg.n_kv_heads
    step_ratio = step["llama_over_gpt2"]
    goals = {
        "llama_step_at_most_1_2x_gpt2": goal(
            "chapter 4's cached step, Llama / GPT-2 at matched parameters", step_ratio, 1.2, False
        ),
        "kv_cache_n_heads_over_n_kv_heads_smaller": goal(
            "KV-cache bytes per token, GPT-2 / Llama", kv["gpt2_over_llama"], ratio_kv, True
        ),
    }
    ops, parts = step["aten_ops_per_step"], step["llama_parts_us_per_step"]
    biggest = ", ".join(
        f"{op} {n:+g}" for op, n in list(step["llama_minus_gpt2_ops_by_name"].items())[:6]
    )
    why = (
        f"a Llama step took {step['llama_minus_gpt2_us']} us more than GPT-2's; timed alone, its "
        f"rotary embeddings take {parts['rotary']} us of a step and repeating the key/value "
        f"heads {parts['expand_kv']} us; an attention's four products written with "
        f"einops.einsum take {parts['projections_einops']} us against "
        f"{parts['projections_as_gpt2_step']} us written as chapter 4's GPT-2 step writes "
        f"them (rotated_qkv writes Q, K and V the second way, attend's output the first). "
        f"It dispatches {ops['llama']} PyTorch operations to "
        f"GPT-2's {ops['gpt2']} ({ops['llama'] / ops['gpt2']:.2f}x; the largest differences, "
        f"Llama minus GPT-2: {biggest}): at 2.6 M parameters a step's time is mostly what its "
        "operations cost to dispatch, so the time ratio follows the count more than the "
        "arithmetic"
    )
    goals["llama_step_at_most_1_2x_gpt2"]["why"] = why
    return {
        "runs": args.runs,
        "parameters": {name: parameters(m) for name, (m, _) in models.items()},
        "models": {"gpt2": str(args.gpt2), "llama": str(args.llama)},
        "cached_step": step,
        "fast_sampler": fast,
        "compiled_backend": {
            "backend": "inductor" if backend is True else backend,
            "why_not_inductor": why_not or None,
        },
        "kv_cache": kv,
        "goals": goals,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2", default="shakespeare")
    parser.add_argument("--llama", default="shakespeare-llama")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--position", type=int, default=128, help="cached positions before a step")
    parser.add_argument("--calls", type=int, default=200, help="steps per timed call")
    parser.add_argument("--new-tokens", type=int, default=None, help="default: n_ctx - 1")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="tiny settings: the smoke test")
    add_record_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.calls, args.new_tokens, args.position = 3, 5, 12, 16
    if min(args.runs, args.calls, args.position, args.threads) < 1:
        parser.error("--runs, --calls, --position and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    emit({"machine": machine(), "cpu": bench(args)}, args)


if __name__ == "__main__":
    main()
