"""The architecture registry (solutions/architectures.py and its HF half in utils/convert.py):
each model class and config class finds its architecture, an unknown one is refused by name, the
two halves list the same architectures, and no code cell of a chapter before chapter 7 names
chapter 7's model (the registry reaches it; the learner of chapters 4 and 5 never reads it)."""

import pytest
import torch

from solutions.architectures import (
    ARCHITECTURES,
    architecture_named,
    architecture_of,
    forward_with_cache,
    model_runner,
)
from solutions.cached_model import forward_with_cache as gpt2_forward_with_cache
from solutions.config import Config
from solutions.llama import LlamaTransformer
from solutions.llama_cache import llama_forward_with_cache
from solutions.llama_config import LlamaConfig
from solutions.llama_paged import LlamaModelRunner
from solutions.model import DemoTransformer
from solutions.model_runner import GPT2ModelRunner
from utils.build import build_notebook
from utils.chapters import chapter_names
from utils.convert import HF_CONVERSIONS, hf_conversion

GPT2_CFG = Config(d_model=16, d_vocab=50, n_ctx=12, d_head=4, d_mlp=32, n_heads=4, n_layers=1)
LLAMA_CFG = LlamaConfig(d_model=16, d_vocab=50, n_ctx=12, d_head=4, d_mlp=24, n_heads=4,
                        n_kv_heads=2, n_layers=1)  # fmt: skip


def test_each_model_and_config_class_finds_its_own_passes():
    gpt2, llama = DemoTransformer(GPT2_CFG), LlamaTransformer(LLAMA_CFG)
    assert architecture_of(gpt2) is architecture_of(GPT2_CFG) is architecture_named("gpt2")
    assert architecture_of(llama) is architecture_of(LLAMA_CFG) is architecture_named("llama")
    assert architecture_of(gpt2).forward_with_cache is gpt2_forward_with_cache
    assert architecture_of(llama).forward_with_cache is llama_forward_with_cache
    assert isinstance(model_runner(gpt2), GPT2ModelRunner)
    assert isinstance(model_runner(llama), LlamaModelRunner)
    assert isinstance(architecture_of(LLAMA_CFG).tied(LLAMA_CFG), LlamaTransformer)


def test_a_subclass_is_its_parents_architecture_unless_registered():
    class Wider(DemoTransformer):
        pass

    assert architecture_of(Wider(GPT2_CFG)) is architecture_of(DemoTransformer(GPT2_CFG))


def test_an_unknown_architecture_is_refused_by_name():
    with pytest.raises(ValueError, match="model must be one of .*DemoTransformer.*got Linear"):
        architecture_of(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"model_type must be one of \['gpt2', 'llama'\].*'bert'"):
        hf_conversion("bert")


def test_the_registry_and_its_hf_half_list_the_same_architectures():
    assert {a.hf_model_type for a in ARCHITECTURES} == set(HF_CONVERSIONS)


def test_the_any_model_pass_is_each_architectures_own_on_the_same_tokens():
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (2, 5))
    for model, own in ((DemoTransformer(GPT2_CFG), gpt2_forward_with_cache),
                       (LlamaTransformer(LLAMA_CFG), llama_forward_with_cache)):  # fmt: skip
        with torch.no_grad():
            torch.testing.assert_close(forward_with_cache(model, tokens)[0], own(model, tokens)[0])


@pytest.mark.parametrize("chapter", [c for c in chapter_names() if c < "07"])
def test_no_code_cell_before_chapter_7_names_its_model(chapter):
    for teacher in (False, True):
        for cell in build_notebook(chapter, teacher=teacher).cells:
            if cell.cell_type == "code":
                assert "llama" not in cell.source.lower(), (chapter, cell.source[:300])
