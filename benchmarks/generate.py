"""Generation speed: the course's uncached, cached and batched generators against HF generate.

    python benchmarks/generate.py [--model shakespeare] [--runs 5] [--device cpu|cuda|all]
                                  [--load N] [--threads T] [--skip-uncached]

Prints one JSON object: tokens/s (medians over `--runs` runs, all methods interleaved in one
process, so they share the machine's mood) and the ratios the course aims at (for each ratio,
the median over runs of the ratio within a run). `--skip-uncached` leaves out the uncached
sampler, which takes most of the time. Every method decodes greedily, so all of them do the
same work and must produce the same tokens (checked). The model's context is n_ctx positions
and HF's GPT-2 cannot go past it, so each run generates n_ctx minus the longest prompt's
length new tokens (255 for a 1-token prompt).

`--load N` starts N busy processes beside the benchmark (each a loop of PyTorch matrix products
with PyTorch's default threads, like a test run), so that the ratios can be read on a machine
that is shared, as CI machines and laptops are. `--threads T` sets PyTorch's intra-op threads
for the benchmark itself (default: PyTorch's choice, one per core).
"""

from __future__ import annotations

import argparse

import torch

from solutions.batched import generate_batch
from solutions.cached_sampling import CachedTransformerSampler
from solutions.sampling import TransformerSampler
from utils.models import load_hf, load_model
from utils.records import add_record_options, emit, machine, rate
from utils.timing import busy_processes, median_ratio, timed

PROMPT_1 = "\n"  # one token
PROMPTS_8 = [
    "ROMEO.\n",
    "JULIET.\nO Romeo,",
    "HAMLET.\nTo be, or not to be,",
    "\n",
    "KING LEAR.\nBlow, winds,",
    "PORTIA.\nThe quality of mercy",
    "PUCK.\n",
    "PROSPERO.\nWe are such stuff as dreams",
]


def bench_device(model_name: str, device: torch.device, runs: int, uncached: bool) -> dict:
    model, tokenizer = load_model(model_name)
    model = model.to(device).eval()
    hf = load_hf(model_name)[0].to(device).eval()
    # No end-of-text stop anywhere: every method runs the full length.
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = tokenizer.eos_token_id
    n_ctx = model.cfg.n_ctx
    plain, cached = TransformerSampler(model, tokenizer), CachedTransformerSampler(model, tokenizer)

    ids_1 = tokenizer.encode(PROMPT_1)
    new_1 = n_ctx - len(ids_1)
    ids_8 = [tokenizer.encode(p) for p in PROMPTS_8]
    new_8 = n_ctx - max(len(p) for p in ids_8)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    hf_in_8 = tokenizer(PROMPTS_8, return_tensors="pt", padding=True).to(device)
    hf_in_1 = torch.tensor([ids_1], device=device)

    def hf_generate(inputs: dict, new: int):
        with torch.inference_mode():
            return hf.generate(
                **inputs, max_new_tokens=new, do_sample=False, top_k=None, use_cache=True
            )

    methods = {
        "uncached_b1": (
            new_1,
            lambda: plain.sample(PROMPT_1, new_1, temperature=0.0, stop_at_eos=False),
        ),
        "cached_b1": (
            new_1,
            lambda: cached.sample(PROMPT_1, new_1, temperature=0.0, stop_at_eos=False),
        ),
        "hf_generate_b1": (new_1, lambda: hf_generate({"input_ids": hf_in_1}, new_1)),
        "batched_b8": (
            8 * new_8,
            lambda: generate_batch(
                model, tokenizer, PROMPTS_8, new_8, temperature=0.0, stop_at_eos=False
            ),
        ),
        "hf_generate_b8": (8 * new_8, lambda: hf_generate(dict(hf_in_8), new_8)),
    }
    if not uncached:
        del methods["uncached_b1"]
    outputs, times = {}, {name: [] for name in methods}
    for name, (_, fn) in methods.items():  # warm-up, and the outputs to cross-check
        outputs[name] = fn()
    for run in range(runs):
        names = list(methods)
        names = names[run % len(names) :] + names[: run % len(names)]  # rotate the order
        for name in names:
            seconds, _ = timed(methods[name][1], device)
            times[name].append(seconds)

    # Same work, same answer: greedy text must agree across methods.
    hf_text_1 = tokenizer.decode(outputs["hf_generate_b1"][0])
    same_b1 = outputs.get("uncached_b1", hf_text_1) == outputs["cached_b1"] == hf_text_1
    hf_texts_8 = [
        tokenizer.decode(row[mask.bool()].tolist() + gen.tolist())
        for row, mask, gen in zip(
            hf_in_8["input_ids"],
            hf_in_8["attention_mask"],
            outputs["hf_generate_b8"][:, hf_in_8["input_ids"].shape[1] :],
            strict=True,
        )
    ]
    same_b8 = outputs["batched_b8"] == hf_texts_8

    def ratio(fast: str, slow: str) -> float:
        """Median over runs of the speed ratio within each run: both were timed minutes apart
        at most, so a busy spell of the machine hits both (a ratio of medians would mix runs)."""
        per_token = methods[fast][0] / methods[slow][0]  # tokens of a fast call per slow one's
        return round(per_token * median_ratio(times[slow], times[fast]), 2)

    pairs = {
        "cached_over_uncached_b1": ("cached_b1", "uncached_b1"),
        "cached_over_hf_b1": ("cached_b1", "hf_generate_b1"),
        "batched_over_hf_b8": ("batched_b8", "hf_generate_b8"),
        "batched_b8_over_cached_b1": ("batched_b8", "cached_b1"),
    }
    return {
        "new_tokens_b1": new_1,
        "new_tokens_b8_per_row": new_8,
        "runs": runs,
        "tokens_per_s": {name: rate(methods[name][0], t) for name, t in times.items()},
        "ratios": {
            name: ratio(fast, slow)
            for name, (fast, slow) in pairs.items()
            if fast in times and slow in times
        },
        "same_tokens_as_hf": {"b1": same_b1, "b8": same_b8},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="shakespeare")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    parser.add_argument("--threads", type=int, default=None, help="PyTorch intra-op threads")
    parser.add_argument(
        "--skip-uncached", action="store_true", help="leave out the slow uncached sampler"
    )
    add_record_options(parser)
    args = parser.parse_args()
    if args.load < 0 or (args.threads is not None and args.threads < 1):
        parser.error("--load must be >= 0 and --threads >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = []
    if args.device in ("cpu", "all"):
        devices.append(torch.device("cpu"))
    if args.device in ("cuda", "all") and torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    if args.device == "cuda" and not devices:
        raise SystemExit("--device cuda: no CUDA device here")
    result = {"model": args.model, "machine": machine(devices[-1]), "load": args.load}
    with busy_processes(args.load):
        for device in devices:
            result[device.type] = bench_device(
                args.model, device, args.runs, not args.skip_uncached
            )
    emit(result, args)


if __name__ == "__main__":
    main()
