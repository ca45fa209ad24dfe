"""Chapter 10's kernels against the PyTorch path and against the memory limit, on a GPU.

    python benchmarks/kernels.py [--device cuda|cpu] [--interpret] [--vocab 50257,128256]
                                 [--batch 1,16,64,256] [--fused 50257x768,128256x4096]
                                 [--reps 20] [--plot latency.png] [--quick]
    python benchmarks/kernels.py --device cpu --interpret --quick    (a smoke test, any CPU)

The defaults are for a GPU. `--interpret` runs the kernels through Triton's interpreter on the
CPU (it needs `--device cpu`); `--quick` shrinks everything to V = 1000, B in {1, 4}, fused
(1000, 64) and 2 reps: a check that the script works (seconds), not a measurement.
Interpreter timings say nothing about a GPU. Progress goes to stderr. Prints one JSON object:

- `machine`: the processor, python, torch and the device (utils/records.machine);
- `environment`: the Triton and CUDA versions, how kernels ran (`mode`: compiled or
  interpreter), the fused runs' dtype, the seed every timed call uses (a runtime argument:
  no kernel is compiled for it), and `read_GBps`: the bandwidth of the largest plain read.
- `sampling`: for each data set and batch B, the median milliseconds of each kernel and of the
  PyTorch path doing the same job. Two data sets, both shaped like a language model's output
  (a few likely tokens, a long tail): "zipf", at each V of `--vocab`, p proportional to
  1 / rank^1.1 with each row's ranks shuffled; "model", V = 4096, the shipped model's
  next-token distributions at the positions of a Shakespeare passage, repeated to B rows.
  Kernels: `sample_from_probs` / torch.multinomial; `gumbel_sample` on the logits / softmax +
  multinomial; `top_p` (0.9) / sort, cumsum, mask, renormalise, multinomial; `top_k` (50) /
  torch.topk + multinomial; `softmax` / torch.softmax. `speedup` = PyTorch ms / kernel ms.
  `floor_ms`: a plain read of the same tensor (a `sum`), timed the same way in the same run
  (the softmax's floor adds a write: two reads' time); `x_floor` = kernel ms / floor_ms.
  `top_p` and `top_k` report `rounds` (max, mean and counts) for the timed calls' seed: the
  kernel's time follows its slowest row. `tokens` checks the last timed call's tokens: all
  valid ids of positive probability (and, for top-k / top-p, in the kept set), and the mean
  probability of the drawn token against its expectation, sum p^2 over the kept set.
- `rejection`: the speculative kernel (k = 4, V = the first vocabulary, each batch; Zipf
  target and draft rows, drafts drawn from the draft rows) against chapter 6's PyTorch
  `rejection_sample`. Its floor is a read of one target and one draft row per sequence (the
  residual at the first rejection); both wrappers also check every probability first
  (chapter 6's contract: all 2k + 1 rows read, with a few device syncs: one per check),
  so x_floor counts that.
- `fused`: for each (V, D) and B, bf16 hidden [B, D] (standard normal) and W_U [V, D]
  (normal / sqrt(D)); float16 below compute capability 8.0 (a T4; `fused_dtype` says which):
  `fused_matmul_sample` against the matmul alone (h @ W_U.T, same dtype) and
  against matmul + float32 softmax + multinomial. `speedup_vs_torch` = the latter's ms / the
  kernel's, `x_matmul` = kernel ms / matmul ms; the floor is a read of W_U.
- `goals` (`met`: true / false, or null with a `reason` where the configuration was not
  run). Each is a target for V = 128256, B = 64, Zipf rows (fused: V = 128256, D = 4096,
  B = 64, bf16), derived from an H100 SXM's figures (3.35 TB/s; 132 SMs; 67 TFLOPS float32,
  which is 128 lanes per SM at 1.98 GHz; 4 warp schedulers per SM, each issuing one warp
  instruction per clock) and from the instruction counts of benchmarks/sass.py (Triton 3.9).
  A bound is what no kernel of this design can beat. One read of the [64, 128256] float32 rows
  (32.8 MB) takes 9.8 us at 3.35 TB/s.
  `from_probs_1_5x_floor`: sample_from_probs within 1.5x one read of the probabilities (bound:
  1x, every probability is read once). Its instructions, 7 summed blocks x 213 + 1 scanned
  block x 1,070 per thread on 16 warps, take 5.2 us on a row's SM, under the read, and 64 rows
  keep 4 MB in flight, twice the 3.35 TB/s x 0.6 us that memory needs: bound by the read, with
  half a read left for the launch and the last block's latency.
  `gumbel_6x_floor`: Gumbel sampling within 6x one read of the logits (bound: about 4.6x).
  2,804 instructions per thread per block of 16,384 columns on 16 warps (88 per column) are
  359,000 warp instructions per row, 45 us on the row's SM at 4 x 1.98 GHz; 6x leaves a third
  more for stalls. (Even spread over all 132 SMs they would take 22 us, 2.2 reads.)
  `top_p_3x`: top-p (0.9) at least 3x the sort-based path. The kernel's time is its slowest
  row's: a round reads the row twice, a draw (950 instructions per thread per block of 8,192 on
  8 warps, 16 blocks: 15 us, 1.6 reads) and a count (1 read), 2.6 reads; the slowest of 64
  Zipf rows takes 2 or 3 rounds (a simulation of these rows: 2 in 69 % of batches, 3 in 29 %),
  so 5 to 8 reads. The sort-based path (torch_top_p below) moves at least 22 reads' worth:
  sort 4 (values and int64 indices), cumsum 2, cumsum - sorted and the mask about 6, sum and
  divide 3, torch.multinomial 7 (chapter 10, section 1, counts the same way), and more in the
  sort's passes: 22 / 6.5 is more than 3.
  `top_k_3x_floor_per_round`: top-k (50) within 3 reads per round of its slowest row
  (x_floor / rounds max). A round is 2.4 reads (a draw of 822 instructions per thread per
  block: 1.4 reads; a count: 1); the slowest of 64 Zipf rows takes 3 to 6 rounds (4 in 65 % of
  simulated batches), about 10 reads in all. Nothing is asked against torch.topk +
  multinomial: torch.topk reads the rows at least once (a radix select, in a few passes), and
  3x faster than it would need it to take some 30 reads.
  `fused`: within 1.1x of the matmul alone and at least 1.2x matmul + softmax + multinomial.
  W_U is 1.05 GB in bf16: one read, 314 us at 3.35 TB/s, bounds the fused kernel and the matmul
  alike (the product's 67 GFLOP take 68 us at 989 dense bf16 TFLOPS). The unfused path moves at
  least 1.41 GB: the matmul writes bf16 logits (16 MB), .float() reads them and writes float32
  (33 MB), softmax reads and writes, and multinomial reads 5 times and writes twice, 422 us
  at 3.35 TB/s. At the same fraction of the bandwidth the fused kernel is then 1.34x faster
  than the unfused path, and 1.34 / 1.1 = 1.22x at 1.1x the matmul: more only where the unfused
  path runs further below the bandwidth than the kernel does.
  Through the interpreter the goals are computed too, but mean nothing.

Timing: every call is timed alone after the L2 cache is flushed by READING a buffer twice its
size (on a GPU; a buffer written with zeros would leave dirty lines that are written back
inside the timed call), with CUDA events on a GPU and time.perf_counter on the CPU; the median
of `--reps` calls after two warm-up calls (compilation excluded). Every ratio is of two
timings of the same run. Every kernel is called through its public wrapper, argument checks
included.
"""

# ruff: noqa: B023  (each lambda is timed at once, inside the loop that binds its tensors)
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from utils.records import add_record_options, emit, machine, verdict
from utils.timing import sig


def number_list(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def shapes(text: str) -> list[tuple[int, ...]]:
    """50257x768,128256x4096 -> [(50257, 768), (128256, 4096)]."""
    return [tuple(int(n) for n in item.split("x")) for item in text.split(",") if item.strip()]


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--interpret", action="store_true", help="Triton's interpreter (CPU)")
    parser.add_argument("--vocab", type=number_list(int), default=[50257, 128256])
    parser.add_argument("--batch", type=number_list(int), default=[1, 16, 64, 256])
    parser.add_argument("--fused", type=shapes, default=shapes("50257x768,128256x4096"))
    parser.add_argument("--reps", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--plot", default=None, help="save a latency-vs-batch plot here")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
    add_record_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.vocab, args.batch, args.fused, args.reps = [1000], [1, 4], [(1000, 64)], 2
    if not (args.vocab and args.batch and args.fused) or args.reps < 1:
        parser.error("--vocab, --batch and --fused need at least one value; --reps >= 1")
    if min(args.vocab + args.batch) < 1 or any(len(s) != 2 or min(s) < 1 for s in args.fused):
        parser.error("sizes must be >= 1, and --fused a list of VxD (e.g. 50257x768)")
    interpret = args.interpret or os.environ.get("TRITON_INTERPRET") == "1"
    if args.device == "cuda" and interpret:
        parser.error(
            "the interpreter runs kernels on the CPU: use --device cpu with --interpret "
            "(and unset TRITON_INTERPRET for --device cuda)"
        )
    if args.device == "cpu" and not interpret:
        parser.error("--device cpu needs --interpret: Triton compiles for GPUs only")
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU here (use --device cpu --interpret)")
    emit(run(args, torch), args)


SEED = 12_345  # every timed call's seed: a runtime argument (not 1, which Triton would fold)
PASSAGE = (
    "MACBETH.\nTomorrow, and tomorrow, and tomorrow,\nCreeps in this petty pace from day to "
    "day,\nTo the last syllable of recorded time;\nAnd all our yesterdays have lighted fools\n"
    "The way to dusty death. Out, out, brief candle!\nLife's but a walking shadow, a poor "
    "player\nThat struts and frets his hour upon the stage,\nAnd then is heard no more."
)


def zipf_logits(torch, batch: int, vocab: int, generator, device, exponent: float = 1.1):
    """log p with p proportional to 1 / rank^exponent, each row's ranks shuffled."""
    ranks = torch.arange(1, vocab + 1, device=device, dtype=torch.float32)
    logp = -exponent * ranks.log()
    logp = logp - torch.logsumexp(logp, 0)
    order = torch.argsort(torch.rand(batch, vocab, generator=generator, device=device), dim=-1)
    return logp[order]


def model_logits(torch, batch: int, device):
    """The shipped model's next-token logits at every position of PASSAGE, repeated to `batch`
    rows."""
    from utils.models import load_model

    model, tokenizer = load_model("shakespeare")
    ids = tokenizer.encode(PASSAGE)
    with torch.inference_mode():
        logits = model(torch.tensor([ids]))[0]  # [positions, 4096]
    reps = -(-batch // logits.shape[0])
    return logits.repeat(reps, 1)[:batch].contiguous().to(device)


class Timer:
    """Median milliseconds of `reps` calls, each after the L2 cache is flushed by reading a
    buffer (twice the L2 on a GPU), after two warm-up calls; also returns the last output."""

    def __init__(self, torch, device: str, reps: int):
        self.torch, self.cuda, self.reps = torch, device == "cuda", reps
        l2 = torch.cuda.get_device_properties(0).L2_cache_size if self.cuda else 1 << 20
        self.flush_buffer = torch.ones(2 * l2 // 4, dtype=torch.float32, device=device)

    def flush(self):
        return self.flush_buffer.sum()  # read, not written: no dirty line left to write back

    def __call__(self, fn) -> tuple[float, object]:
        torch = self.torch
        fn()
        out = fn()
        times = []
        for _ in range(self.reps):
            self.flush()
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                begin = time.perf_counter()
                out = fn()
                times.append(1e3 * (time.perf_counter() - begin))
        return statistics.median(times), out


def round_counts(torch, rounds) -> dict:
    counts = torch.bincount(rounds.long().cpu())
    return {
        "max": int(rounds.max()),
        "mean": round(float(rounds.float().mean()), 3),
        "rows_by_rounds": {str(r): int(n) for r, n in enumerate(counts.tolist()) if n},
    }


def token_check(torch, tokens, probs, kept=None) -> dict:
    """The drawn tokens: valid ids, of positive probability, in the kept set; the mean
    probability of the drawn token against its expectation under the (kept, renormalised)
    distribution, sum p^2, averaged over rows."""
    tokens = tokens.reshape(-1).long()
    vocab = probs.shape[1]
    valid = bool(((tokens >= 0) & (tokens < vocab)).all())
    result = {"valid_ids": valid}
    if not valid:
        return result
    p = probs if kept is None else probs * kept
    p = p / p.sum(-1, keepdim=True)
    drawn = p.gather(1, tokens[:, None])[:, 0]
    result["positive_and_kept"] = bool((drawn > 0).all())
    result["mean_p_of_token"] = sig(float(drawn.mean()))
    result["expected"] = sig(float((p * p).sum(-1).mean()))
    return result


def top_p_kept(torch, probs, top_p: float):
    """The top-p set: tokens whose more likely tokens hold less than top_p."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    return torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, before < top_p)


def top_k_kept(torch, probs, k: int):
    order = probs.topk(k, dim=-1).indices
    return torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, True)


def run(args, torch) -> dict:
    import triton

    from solutions.kernels import runtime
    from solutions.kernels.fused_matmul import fused_matmul_sample
    from solutions.kernels.gumbel import gumbel_sample
    from solutions.kernels.inverse_transform import sample_from_probs
    from solutions.kernels.rejection import rejection_sample
    from solutions.kernels.row_softmax import softmax
    from solutions.kernels.top_k_top_p import top_k_top_p_sample
    from solutions.speculative import rejection_sample as torch_rejection_sample

    device = args.device
    cuda = device == "cuda"
    timer = Timer(torch, device, args.reps)

    def ms(fn) -> float:
        return timer(fn)[0]

    def read_ms(x) -> float:
        return ms(lambda: x.sum())

    def entry(kernel_ms, torch_ms, floor_ms, **extra):
        return {
            "kernel_ms": sig(kernel_ms),
            "torch_ms": sig(torch_ms),
            "speedup": sig(torch_ms / kernel_ms),
            "floor_ms": sig(floor_ms),
            "x_floor": sig(kernel_ms / floor_ms),
            **extra,
        }

    g = torch.Generator(device=device).manual_seed(0)
    datasets = [("zipf", v) for v in args.vocab] + ([] if args.quick else [("model", 4096)])
    sampling, read_gbps = [], 0.0
    for data, v in datasets:
        for b in args.batch:
            progress(f"sampling: {data}, V = {v}, B = {b}")
            if data == "zipf":
                logits = zipf_logits(torch, b, v, g, device)
            else:
                logits = model_logits(torch, b, device)
            probs = logits.softmax(-1)
            floor = read_ms(probs)
            read_gbps = max(read_gbps, probs.numel() * 4 / (floor / 1e3) / 1e9)
            t_probs, tokens_probs = timer(lambda: sample_from_probs(probs, SEED))
            t_gumbel, tokens_gumbel = timer(lambda: gumbel_sample(logits, 1.0, SEED))
            t_top_p, tokens_top_p = timer(lambda: top_k_top_p_sample(probs, top_p=0.9, seed=SEED))
            t_top_k, tokens_top_k = timer(lambda: top_k_top_p_sample(probs, top_k=50, seed=SEED))
            _, rounds_p = top_k_top_p_sample(probs, top_p=0.9, seed=SEED, return_rounds=True)
            _, rounds_k = top_k_top_p_sample(probs, top_k=50, seed=SEED, return_rounds=True)
            kept_p, kept_k = top_p_kept(torch, probs, 0.9), top_k_kept(torch, probs, min(50, v))
            sampling.append(
                {
                    "data": data,
                    "vocab": v,
                    "batch": b,
                    "sample_from_probs": entry(
                        t_probs, ms(lambda: torch.multinomial(probs, 1)), floor,
                        tokens=token_check(torch, tokens_probs, probs),
                    ),
                    "gumbel": entry(
                        t_gumbel, ms(lambda: torch.multinomial(logits.softmax(-1), 1)),
                        read_ms(logits), tokens=token_check(torch, tokens_gumbel, probs),
                    ),
                    "top_p": entry(
                        t_top_p, ms(lambda: torch_top_p(torch, probs, 0.9)), floor,
                        rounds=round_counts(torch, rounds_p),
                        tokens=token_check(torch, tokens_top_p, probs, kept_p),
                    ),
                    "top_k": entry(
                        t_top_k, ms(lambda: torch_top_k(torch, probs, 50)), floor,
                        rounds=round_counts(torch, rounds_k),
                        tokens=token_check(torch, tokens_top_k, probs, kept_k),
                    ),
                    "softmax": entry(
                        ms(lambda: softmax(logits)), ms(lambda: torch.softmax(logits, -1)),
                        2 * read_ms(logits),
                    ),
                }
            )  # fmt: skip

    k, v = 4, args.vocab[0]
    rejection = []
    draws = torch.Generator(device=device).manual_seed(SEED)  # the rejection sampler's u
    for b in args.batch:
        progress(f"rejection: V = {v}, B = {b}, k = {k}")
        target = zipf_logits(torch, b * (k + 1), v, g, device).softmax(-1).reshape(b, k + 1, v)
        draft = zipf_logits(torch, b * k, v, g, device).softmax(-1).reshape(b, k, v)
        tokens = torch.multinomial(draft.reshape(-1, v), 1, generator=g).reshape(b, k)
        pair = torch.stack([target[:, 0], draft[:, 0]], dim=1).contiguous()
        rejection.append(
            {
                "vocab": v,
                "batch": b,
                "k": k,
                **entry(
                    ms(lambda: rejection_sample(target, draft, tokens, draws)),
                    ms(lambda: torch_rejection_sample(target, draft, tokens, draws)),
                    read_ms(pair),
                ),
            }
        )

    fused = []
    # bfloat16 as serving engines use it; below sm_80 (a T4) float16: Turing's tensor cores,
    # which cuBLAS uses, take no bfloat16 (Triton's tl.dot uses none there: sass.py --arch 75).
    old_gpu = cuda and torch.cuda.get_device_capability() < (8, 0)
    dtype = torch.float16 if old_gpu else torch.bfloat16
    for v, d in args.fused:
        w = (torch.randn(v, d, generator=g, device=device) / d**0.5).to(dtype)
        floor = read_ms(w)
        for b in args.batch:
            progress(f"fused: V = {v}, D = {d}, B = {b}")
            h = torch.randn(b, d, generator=g, device=device).to(dtype)
            kernel = ms(lambda: fused_matmul_sample(h, w, 1.0, SEED))
            matmul = ms(lambda: h @ w.T)
            full = ms(lambda: torch.multinomial((h @ w.T).float().softmax(-1), 1))
            speedup, x_matmul = full / kernel, kernel / matmul
            fused.append(
                {
                    "vocab": v,
                    "d_model": d,
                    "batch": b,
                    "kernel_ms": sig(kernel),
                    "matmul_ms": sig(matmul),
                    "matmul_softmax_multinomial_ms": sig(full),
                    "speedup_vs_torch": sig(speedup),
                    "x_matmul": sig(x_matmul),
                    "floor_ms": sig(floor),
                    "x_floor": sig(kernel / floor),
                    "meets_goal": fused_ok(sig(speedup), sig(x_matmul)),
                }
            )

    result = {
        "machine": machine("cuda" if cuda else None),
        "environment": {
            "cuda": torch.version.cuda if cuda else None,
            "triton": triton.__version__,
            "mode": runtime.mode(),
            "seed": SEED,
            "data": "zipf: p ~ 1 / rank^1.1, ranks shuffled per row; model: the shipped "
            "model's next-token distributions on a passage (V = 4096)",
            "fused_dtype": str(dtype).removeprefix("torch."),
            "read_GBps": round(read_gbps, 1),
        },
        "sampling": sampling,
        "rejection": rejection,
        "fused": fused,
        "goals": goals(sampling, fused),
    }
    if args.plot:
        plot(sampling, args.plot)
        result["plot"] = args.plot
    return result


def torch_top_p(torch, probs, top_p: float):
    """Sort-based top-p, as chapter 3 does it, then multinomial."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return order.gather(-1, torch.multinomial(sorted_probs, 1))


def torch_top_k(torch, probs, k: int):
    values, order = probs.topk(k, dim=-1)
    return order.gather(-1, torch.multinomial(values / values.sum(-1, keepdim=True), 1))


def fused_ok(speedup_vs_torch: float, x_matmul: float) -> bool:
    return speedup_vs_torch >= 1.2 and x_matmul <= 1.1


NOT_RUN = verdict(None, reason="V = 128256, B = 64 (Zipf) was not run")


def goals(sampling: list[dict], fused: list[dict]) -> dict:
    at = next((s for s in sampling if s["data"] == "zipf" and s["vocab"] == 128256
               and s["batch"] == 64), None)  # fmt: skip

    def goal(kernel, key, bound, target, at_least):
        if at is None:
            return NOT_RUN
        value = at[kernel][key]
        return verdict(value >= bound if at_least else value <= bound, target=target,
                       **{key: value})  # fmt: skip

    def per_round(kernel, most, target):
        if at is None:
            return NOT_RUN
        rounds = at[kernel]["rounds"]["max"]
        value = sig(at[kernel]["x_floor"] / rounds)
        return verdict(value <= most, target=target, x_floor_per_round=value, rounds_max=rounds)

    out = {
        "from_probs_1_5x_floor": goal("sample_from_probs", "x_floor", 1.5,
                                      "sample_from_probs <= 1.5x one read of the probs", False),
        "gumbel_6x_floor": goal("gumbel", "x_floor", 6.0,
                                "Gumbel sampling <= 6x one read of the logits (bound: about "
                                "4.6x, the instructions of one row per SM)", False),
        "top_p_3x": goal("top_p", "speedup", 3.0, "top-p >= 3x the sort-based path", True),
        "top_k_3x_floor_per_round": per_round(
            "top_k", 3.0, "top-k <= 3 reads per round of its slowest row (x_floor / rounds max)"),
    }  # fmt: skip
    shape = (128256, 4096, 64)
    big = next((f for f in fused if (f["vocab"], f["d_model"], f["batch"]) == shape), None)
    out["fused"] = verdict(None, reason="V = 128256, D = 4096, B = 64 was not run")
    if big:
        out["fused"] = verdict(
            big["meets_goal"],
            target="<= 1.1x the matmul alone and >= 1.2x matmul + softmax + multinomial",
            x_matmul=big["x_matmul"],
            speedup_vs_torch=big["speedup_vs_torch"],
        )
    if fused:
        out["fused"]["failing"] = [
            [f["vocab"], f["d_model"], f["batch"]] for f in fused if not f["meets_goal"]
        ]
    return out


def plot(sampling: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    v = max(s["vocab"] for s in sampling if s["data"] == "zipf")
    rows = [s for s in sampling if s["data"] == "zipf" and s["vocab"] == v]
    batch = [s["batch"] for s in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, name in [("top_p", "top-p 0.9"), ("sample_from_probs", "sampling from probs")]:
        ax.plot(batch, [s[key]["kernel_ms"] for s in rows], "o-", label=f"{name}: kernel")
        ax.plot(batch, [s[key]["torch_ms"] for s in rows], "s--", label=f"{name}: PyTorch")
    ax.plot(batch, [s["sample_from_probs"]["floor_ms"] for s in rows], ":", c="k",
            label="one read of the probabilities")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="ms (median)",
           title=f"Sampling latency, V = {v} (Zipf rows)")  # fmt: skip
    ax.set_xticks(batch, [str(b) for b in batch])  # the batches run, not powers of 10
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
