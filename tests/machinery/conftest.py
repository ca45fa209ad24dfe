"""Fixtures the machinery's tests share (helpers they share are in tests/support.py)."""

import pytest

from solutions.llama import LlamaTransformer
from tests.support import LLAMA_MODEL
from utils.models import load_hf, load_model


@pytest.fixture(scope="module")
def llama():
    """(model, tokenizer, HF's LlamaForCausalLM on the same weights): the shipped Llama model,
    loaded again for each test module that asks."""
    model, tokenizer = load_model(LLAMA_MODEL)
    assert isinstance(model, LlamaTransformer)
    return model, tokenizer, load_hf(LLAMA_MODEL)[0]
