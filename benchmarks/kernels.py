"""Chapter 6's kernels against the PyTorch path and against the memory limit, on a GPU.

    python benchmarks/kernels.py [--device cuda|cpu] [--interpret] [--vocab 50257,128256]
                                 [--batch 1,16,64,256] [--fused 50257x768,128256x4096]
                                 [--reps 5] [--plot latency.png] [--quick]
    python benchmarks/kernels.py --device cpu --interpret --quick    (a smoke test, any CPU)

The defaults are for a GPU. `--interpret` runs the kernels through Triton's interpreter on the
CPU (it needs `--device cpu`); `--quick` shrinks everything to V = 1000, B in {1, 4}, fused
(1000, 64) and 2 reps: a check that the script works (about 6 s), not a measurement.
Progress goes to stderr. Prints one JSON object:

- `environment`: device, python, torch and triton versions, how kernels ran (`mode`: compiled
  or interpreter), the dtype of the fused runs, and `copy_GBps`: the bandwidth of a large
  device-to-device `dst.copy_(src)` measured in this run (1 GiB on a GPU, 16 MiB on a CPU),
  counting the bytes read and the bytes written.
- `sampling`: for each vocabulary size V and batch B, with probabilities softmax(2 z) of
  standard normal z (float32, fixed seed), the median milliseconds of each kernel and of the
  PyTorch path doing the same job: `sample_from_probs` / torch.multinomial;
  `gumbel_sample` on the logits / softmax + multinomial; `top_p` (0.9) / sort, cumsum, mask,
  renormalise, multinomial; `top_k` (50) / torch.topk + multinomial; `softmax` /
  torch.softmax. `speedup` = PyTorch ms / kernel ms. `floor_ms` = the bytes the kernel must
  move (one read of the [B, V] float32 rows; the softmax also writes them) / copy_GBps, and
  `x_floor` = kernel ms / floor_ms. `top_p` also reports the mean rounds per row.
- `rejection`: the speculative kernel (k = 4, V = the first vocabulary, each batch) against
  chapter 5's PyTorch `rejection_sample` on the same target [B, k + 1, V] and draft [B, k, V]
  probabilities (softmax of standard normal logits) and drafts sampled from the draft rows.
  Its floor is one read of a target and a draft row per sequence (2 B V float32: the
  residual max(0, p - q) at the first rejection); both wrappers also check every probability
  first (chapter 5's contract: a read of all 2k + 1 rows and one sync), so x_floor counts that.
- `fused`: for each (V, D) and B, bf16 hidden [B, D] (standard normal) and W_U [V, D]
  (normal / sqrt(D)): `fused_matmul_sample` against the matmul alone (h @ W_U.T, bf16) and
  against matmul + float32 softmax + multinomial. `speedup_vs_torch` = the latter's ms / the
  kernel's, `x_matmul` = kernel ms / matmul ms, `meets_goal` = both goals below hold; the floor
  is one read of W_U (V D bf16 bytes: the matmul alone cannot do less).
- `goals` (`passed`: true / false, or null with a `reason` where the configuration was not
  run): `top_p_10x`, top-p >= 10x faster than the sort-based path at V = 128256, B = 64;
  `fused`, the fused kernel >= 3x faster than matmul + softmax + multinomial and within 1.3x
  of the matmul alone, for every (V, D, B) run (`at_batch_64` the same for B = 64 alone,
  `failing` the [V, D, B] that miss); `from_probs_3x_floor`, `sample_from_probs` within 3x of
  one read of the probabilities at V = 128256, B = 64, else at the largest V and B run (`at`
  says which). Through the interpreter the goals are computed too, but mean nothing.

Timing: on CUDA, triton.testing.do_bench (the median over about 50 ms of calls after 10 ms of
warm-up, the L2 cache cleared before each call); on the CPU, the median of --reps calls
after one warm-up call (time.perf_counter). Every ratio is of two timings of the same run.
Every kernel is called through its public wrapper, argument checks included.
"""

# ruff: noqa: B023  (each lambda is timed at once, inside the loop that binds its tensors)
from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
import time


def sig(x: float, digits: int = 4) -> float:
    """x to `digits` significant digits (a ratio of 0.0004 must not print as 0.0)."""
    return float(f"{x:.{digits}g}")


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
    parser.add_argument("--reps", type=int, default=5, help="timed calls on the CPU")
    parser.add_argument("--plot", default=None, help="save a latency-vs-batch plot here")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test")
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
    result = run(args, torch)
    print(json.dumps(result, indent=2))


def run(args, torch) -> dict:
    import triton

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:  # python benchmarks/kernels.py where the course is not installed
        sys.path.insert(0, root)
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

    median = {"return_mode": "median"}  # triton >= 2.2; before it, the median is quantile 0.5
    if "return_mode" not in inspect.signature(triton.testing.do_bench).parameters:
        median = {"quantiles": [0.5]}

    def ms(fn) -> float:
        if cuda:
            t = triton.testing.do_bench(fn, warmup=10, rep=50, **median)
            return float(t[0] if isinstance(t, list | tuple) else t)
        times = []
        fn()
        for _ in range(args.reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)

    copy_gbps = copy_bandwidth(torch, device, ms, small=not cuda)
    floor = lambda n_bytes: 1e3 * n_bytes / (copy_gbps * 1e9)  # noqa: E731

    def entry(kernel_ms, torch_ms, n_bytes, **extra):
        return {
            "kernel_ms": sig(kernel_ms),
            "torch_ms": sig(torch_ms),
            "speedup": sig(torch_ms / kernel_ms),
            "floor_ms": sig(floor(n_bytes)),
            "x_floor": sig(kernel_ms / floor(n_bytes)),
            **extra,
        }

    progress(f"copy bandwidth: {copy_gbps:.1f} GB/s")
    g = torch.Generator(device=device).manual_seed(0)
    sampling = []
    for v in args.vocab:
        for b in args.batch:
            progress(f"sampling: V = {v}, B = {b}")
            logits = torch.randn(b, v, generator=g, device=device) * 2
            probs = logits.softmax(-1)
            row_bytes = b * v * 4
            _, rounds = top_k_top_p_sample(probs, top_p=0.9, return_rounds=True)
            sampling.append(
                {
                    "vocab": v,
                    "batch": b,
                    "sample_from_probs": entry(
                        ms(lambda: sample_from_probs(probs, 1)),
                        ms(lambda: torch.multinomial(probs, 1)),
                        row_bytes,
                    ),
                    "gumbel": entry(
                        ms(lambda: gumbel_sample(logits, 1.0, 1)),
                        ms(lambda: torch.multinomial(logits.softmax(-1), 1)),
                        row_bytes,
                    ),
                    "top_p": entry(
                        ms(lambda: top_k_top_p_sample(probs, top_p=0.9, seed=1)),
                        ms(lambda: torch_top_p(torch, probs, 0.9)),
                        row_bytes,
                        mean_rounds=round(float(rounds.float().mean()), 2),
                    ),
                    "top_k": entry(
                        ms(lambda: top_k_top_p_sample(probs, top_k=50, seed=1)),
                        ms(lambda: torch_top_k(torch, probs, 50)),
                        row_bytes,
                    ),
                    "softmax": entry(
                        ms(lambda: softmax(logits)),
                        ms(lambda: torch.softmax(logits, -1)),
                        2 * row_bytes,
                    ),
                }
            )

    k, v = 4, args.vocab[0]
    rejection = []
    for b in args.batch:
        progress(f"rejection: V = {v}, B = {b}, k = {k}")
        target = torch.randn(b, k + 1, v, generator=g, device=device).softmax(-1)
        draft = torch.randn(b, k, v, generator=g, device=device).softmax(-1)
        tokens = torch.multinomial(draft.reshape(-1, v), 1, generator=g).reshape(b, k)
        rejection.append(
            {
                "vocab": v,
                "batch": b,
                "k": k,
                **entry(
                    ms(lambda: rejection_sample(target, draft, tokens)),
                    ms(lambda: torch_rejection_sample(target, draft, tokens)),
                    2 * b * v * 4,
                ),
            }
        )

    fused = []
    dtype = torch.bfloat16
    for v, d in args.fused:
        w = (torch.randn(v, d, generator=g, device=device) / d**0.5).to(dtype)
        for b in args.batch:
            progress(f"fused: V = {v}, D = {d}, B = {b}")
            h = torch.randn(b, d, generator=g, device=device).to(dtype)
            kernel = ms(lambda: fused_matmul_sample(h, w, 1.0, 1))
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
                    "floor_ms": sig(floor(v * d * w.element_size())),
                    "x_floor": sig(kernel / floor(v * d * w.element_size())),
                    "meets_goal": fused_ok(sig(speedup), sig(x_matmul)),
                }
            )

    result = {
        "environment": {
            "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None,
            "triton": triton.__version__,
            "mode": runtime.mode(),
            "data": "sampling: float32 logits 2 z, probs softmax(2 z), z ~ N(0, 1), seed 0",
            "fused_dtype": str(dtype).removeprefix("torch."),
            "copy_GBps": round(copy_gbps, 1),
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


def copy_bandwidth(torch, device: str, ms, small: bool) -> float:
    """GB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    n = (1 << 22) if small else (1 << 28)  # 16 MB on a CPU, 1 GB on a GPU
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = ms(lambda: dst.copy_(src)) / 1e3
    return 2 * n * 4 / seconds / 1e9


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
    return speedup_vs_torch >= 3 and x_matmul <= 1.3


def goals(sampling: list[dict], fused: list[dict]) -> dict:
    def find(v, b):
        return next((s for s in sampling if s["vocab"] == v and s["batch"] == b), None)

    at = find(128256, 64)
    top_p = {"passed": None, "reason": "V = 128256, B = 64 was not run"}
    if at:
        top_p = {
            "passed": at["top_p"]["speedup"] >= 10,
            "target": ">= 10x the sort-based top-p at V = 128256, B = 64",
            "speedup": at["top_p"]["speedup"],
        }
    # Sampling from probabilities: at V = 128256, B = 64, else at the largest run.
    largest = at or find(max(s["vocab"] for s in sampling), max(s["batch"] for s in sampling))
    from_probs = {
        "passed": largest["sample_from_probs"]["x_floor"] <= 3,
        "target": "sample_from_probs within 3x of one read of the probabilities",
        "at": {"vocab": largest["vocab"], "batch": largest["batch"]},
        "x_floor": largest["sample_from_probs"]["x_floor"],
    }
    fused_goal = {"passed": None, "reason": "no fused configuration was run"}
    if fused:
        at_64 = [f for f in fused if f["batch"] == 64]
        fused_goal = {
            "passed": all(f["meets_goal"] for f in fused),
            "target": ">= 3x matmul + softmax + multinomial and <= 1.3x the matmul alone",
            "at_batch_64": all(f["meets_goal"] for f in at_64) if at_64 else None,
            "worst_speedup_vs_torch": min(f["speedup_vs_torch"] for f in fused),
            "worst_x_matmul": max(f["x_matmul"] for f in fused),
            "failing": [
                [f["vocab"], f["d_model"], f["batch"]] for f in fused if not f["meets_goal"]
            ],
        }
    return {"top_p_10x": top_p, "fused": fused_goal, "from_probs_3x_floor": from_probs}


def plot(sampling: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    v = max(s["vocab"] for s in sampling)
    rows = [s for s in sampling if s["vocab"] == v]
    batch = [s["batch"] for s in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, name in [("top_p", "top-p 0.9"), ("sample_from_probs", "sampling from probs")]:
        ax.plot(batch, [s[key]["kernel_ms"] for s in rows], "o-", label=f"{name}: kernel")
        ax.plot(batch, [s[key]["torch_ms"] for s in rows], "s--", label=f"{name}: PyTorch")
    ax.plot(batch, [s["sample_from_probs"]["floor_ms"] for s in rows], ":", c="k",
            label="one read of the probabilities")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="ms (median)",
           title=f"Sampling latency, V = {v}")  # fmt: skip
    ax.set_xticks(batch, [str(b) for b in batch])  # the batches run, not powers of 10
    ax.xaxis.set_minor_locator(NullLocator())
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
