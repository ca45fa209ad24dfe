"""A decoding step recorded once as a CUDA graph and replayed: one launch instead of hundreds.

On a GPU, each operation of a step is a kernel that the CPU must launch, and for a small model a
launch costs more than the kernel's work. A CUDA graph records the kernels of one call, with the
addresses of every tensor they read and write, and replays all of them with a single launch
(NVIDIA, "Getting Started with CUDA Graphs"; PyTorch's `torch.cuda.graphs` documentation). A
replay runs the same kernels on the same memory: the inputs are copied into the tensors the
recording read, and the outputs are read from the tensors it wrote. That is why the static cache
comes first: chapter 4's cache moves to new memory at every step and could not be replayed.
`torch.compile(mode="reduce-overhead")` does this recording for a compiled step.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

from solutions.fast_sampling import decode_step
from solutions.model import DemoTransformer
from solutions.static_cache import StaticKeyValueCache


class GraphedStep:
    """`decode_step(model, cache, token, slot, position)` for one model and one cache, recorded
    once as a CUDA graph; calls copy their arguments in and replay it. Make it before the
    prefill: the warm-up and the recording write the cache's last slot."""

    def __init__(self, model: DemoTransformer, cache: StaticKeyValueCache, warmup: int = 3):
        if cache.device.type != "cuda":
            raise ValueError(
                f"cache must be on a CUDA device to record a graph, got {cache.device}"
            )
        device = cache.device
        self.token = torch.zeros(cache.batch, 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(cache.batch, 1, dtype=torch.long, device=device)
        self.slot.fill_(cache.cfg.n_ctx - 1)  # written by the warm-up and the recording
        self.cache = cache
        mask = cache.mask.clone()  # put back afterwards: those writes are not a real token
        # Warm up on a side stream (PyTorch's documented recipe): the first calls allocate
        # workspaces and pick kernels, which a recording must not capture.
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                decode_step(model, cache, self.token, self.slot, self.position)
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = decode_step(model, cache, self.token, self.slot, self.position)
        cache.mask.copy_(mask)

    def __call__(
        self,
        model: DemoTransformer,
        cache: StaticKeyValueCache,
        token: Int[Tensor, "batch 1"],
        slot: Int[Tensor, "1"],
        position: Int[Tensor, "batch 1"],
    ) -> Float[Tensor, "batch d_vocab"]:
        if cache is not self.cache:
            raise ValueError("a graphed step replays on the cache it was recorded with")
        self.token.copy_(token)
        self.slot.copy_(slot)
        self.position.copy_(position)
        self.graph.replay()
        return self.logits
