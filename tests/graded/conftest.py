"""Fixtures shared by the graded tests: the reference model and its activations."""

from __future__ import annotations

import pytest
import torch

from utils.models import load_reference, tiny_model_dir

# A fixed prompt: long enough for attention to matter, short enough for the tiny model.
PROMPT = "A language model reads tokens and predicts the next one, again and again."


@pytest.fixture(scope="session")
def reference():
    """transformer-lens 4 bridge + HF GPT-2 on the same weights (built locally, offline)."""
    return load_reference(tiny_model_dir())


@pytest.fixture(scope="session")
def ref_run(reference):
    """(tokens, logits, activation cache) of the reference model on PROMPT."""
    tokens = reference.bridge.to_tokens(PROMPT)
    with torch.no_grad():
        logits, cache = reference.bridge.run_with_cache(tokens)
    return tokens, logits.detach(), {k: v.detach() for k, v in cache.items()}
