"""Fixtures shared by the graded tests: the reference model and its activations."""

from __future__ import annotations

import pytest
import torch

from tests.graded._oracles import PROMPT
from utils.models import load_reference


@pytest.fixture(scope="session")
def reference():
    """transformer-lens 4 bridge + HF GPT-2 on the course's shipped model, offline."""
    return load_reference("shakespeare")


@pytest.fixture(scope="session")
def ref_run(reference):
    """(tokens, logits, activation cache) of the reference model on PROMPT."""
    tokens = reference.bridge.to_tokens(PROMPT)
    with torch.no_grad():
        logits, cache = reference.bridge.run_with_cache(tokens)
    return tokens, logits.detach(), {k: v.detach() for k, v in cache.items()}
