"""The grading reference itself: built offline, and its three views of one model agree."""

import torch

from utils.models import load_reference, load_weights
from utils.tiny_model import build_tiny_gpt2, tiny_model_dir


def test_bridge_and_hf_agree():
    reference = load_reference(tiny_model_dir())
    tokens = reference.bridge.to_tokens("The model reads tokens.")
    with torch.no_grad():
        bridge_logits = reference.bridge(tokens)
        hf_logits = reference.hf_model(tokens).logits
    assert (bridge_logits - hf_logits).abs().max() < 1e-4


def test_solution_demo_transformer_agrees_with_reference():
    from solutions import DemoTransformer

    reference = load_reference(tiny_model_dir())
    demo = load_weights(DemoTransformer(reference.cfg), reference.params).eval()
    tokens = reference.bridge.to_tokens("The model reads tokens.")
    with torch.no_grad():
        assert (demo(tokens) - reference.hf_model(tokens).logits).abs().max() < 1e-4


def test_tiny_model_is_deterministic(tmp_path):
    a = build_tiny_gpt2(tmp_path / "a")
    b = build_tiny_gpt2(tmp_path / "b")
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
