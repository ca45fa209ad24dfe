"""Chapter 5's GraphedStep (given): refused off a GPU with a clear error; on a GPU, each replay
gives decode_step's logits and writes the cache as decode_step does (marked `gpu`: skipped
without CUDA, as in CI)."""

import pytest
import torch

from solutions.cuda_graphs import GraphedStep
from solutions.fast_sampling import decode_step
from solutions.static_cache import StaticKeyValueCache
from utils.models import load_model


def test_a_cache_off_the_gpu_is_refused():
    model = load_model("shakespeare-draft")[0]
    with pytest.raises(ValueError, match="CUDA device"):
        GraphedStep(model, StaticKeyValueCache(model.cfg, batch=1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replays_give_the_eager_steps_logits_and_cache():
    gpu = torch.device("cuda")
    model = load_model("shakespeare")[0].to(gpu).eval()
    eager, graphed = (StaticKeyValueCache(model.cfg, batch=2, device=gpu) for _ in range(2))
    step = GraphedStep(model, graphed)
    tokens = torch.tensor([[5, 17, 300, 2, 9, 41], [8, 8, 1000, 3, 77, 6]], device=gpu)
    with torch.inference_mode():
        for i in range(tokens.shape[1]):
            slot = torch.tensor([i], device=gpu)
            position = slot.expand(2)[:, None]
            want = decode_step(model, eager, tokens[:, i : i + 1], slot, position)
            got = step(model, graphed, tokens[:, i : i + 1], slot, position)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(graphed.mask, eager.mask)
    written = slice(0, tokens.shape[1])  # (recording wrote the last slot, which is masked)
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(
            graphed.keys[layer][:, :, written], eager.keys[layer][:, :, written]
        )
        torch.testing.assert_close(
            graphed.values[layer][:, :, written], eager.values[layer][:, :, written]
        )
