"""load_model on a Llama-architecture checkpoint: the path that loads SmolLM2-135M from the HF
hub, tested offline on a stand-in with SmolLM2's traits, and the configs the course's
LlamaTransformer does not compute, refused by name.

The stand-in is what SmolLM2-135M's config.json says, at a small width: 9 query heads and 3
key/value heads, `rope_theta` 1e5 in the old top-level key (transformers 5 keeps it in
`rope_parameters`: a loader that missed the old key would turn by 1e4's angles), tied
embeddings, "bfloat16" as its saved dtype, and its config's other field names; 2 layers and
random weights. HF's LlamaForCausalLM, loaded from the same folder in float32, is the oracle.
"""

import json
import shutil

import pytest
import torch

from solutions.llama import LlamaTransformer
from utils.models import is_hub_name, load_hf, load_model
from utils.paths import MODELS_DIR

# SmolLM2-135M's config.json, its fields as it writes them, with small widths and 2 layers.
SMOLLM2_LIKE = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "hidden_act": "silu",
    "hidden_size": 72,  # 9 heads of 8
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 160,
    "is_llama_config": True,
    "max_position_embeddings": 64,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 2,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": True,
    "vocab_size": 4096,  # the shipped tokenizer's
}

PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks?"


def write_checkpoint(folder, config: dict, weights_from=None):
    """A checkpoint folder with `config` as its config.json (written last, as given, so that
    HF's save does not rewrite it into its newer form) and the shipped tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    if weights_from is None:
        torch.manual_seed(0)
        hf = LlamaForCausalLM(LlamaConfig(**config))
        with torch.no_grad():  # RMSNorm scales other than 1: a norm left unscaled shows
            for name, param in hf.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(0.5, 1.5)
        hf.save_pretrained(folder)
    else:
        shutil.copy(weights_from / "model.safetensors", folder / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODELS_DIR / "shakespeare" / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("smollm2-like"), SMOLLM2_LIKE)


def test_a_smollm2_like_checkpoint_loads_into_the_llama_transformer(standin):
    from transformers import LlamaForCausalLM

    model, tokenizer = load_model(standin)
    assert isinstance(model, LlamaTransformer)
    cfg = model.cfg
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.n_layers) == (9, 3, 8, 2)
    assert cfg.rope_theta == 100000.0, "rope_theta is read from the old top-level key"
    assert "unembed.W_U" not in model.state_dict(), "tied embeddings stay tied"
    assert all(p.dtype == torch.float32 for p in model.parameters())
    hf = LlamaForCausalLM.from_pretrained(standin, dtype=torch.float32).eval()
    assert hf.config.rope_parameters["rope_theta"] == 100000.0  # HF read it too
    tokens = torch.tensor([tokenizer.encode(PROMPT)])
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)
    # The HF model load_model went through is float32 too, whatever the checkpoint says.
    assert load_hf(standin)[0].dtype == torch.float32


def test_greedy_tokens_equal_hf_generate(standin):
    from transformers import LlamaForCausalLM

    from solutions.cached_sampling import CachedTransformerSampler

    model, tokenizer = load_model(standin)
    hf = LlamaForCausalLM.from_pretrained(standin, dtype=torch.float32).eval()
    ids = tokenizer.encode(PROMPT)
    expected = hf.generate(
        torch.tensor([ids]), max_new_tokens=20, do_sample=False, eos_token_id=None,
        pad_token_id=tokenizer.eos_token_id,
    )[0].tolist()  # fmt: skip
    sampler = CachedTransformerSampler(model, tokenizer)
    assert sampler.sample(ids, 20, temperature=0.0, stop_at_eos=False).tolist() == expected


@pytest.mark.parametrize(
    "change, field",
    [
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                }
            },
            "rope_type",
        ),  # fmt: skip
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"sliding_window": 16}, "sliding_window"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
    ids=["rope-scaling-llama3", "attention-bias", "mlp-bias", "sliding-window", "gelu"],
)
def test_a_config_the_course_does_not_compute_is_refused_by_name(standin, tmp_path, change, field):
    folder = write_checkpoint(tmp_path / field, SMOLLM2_LIKE | change, weights_from=standin)
    with pytest.raises(ValueError, match=field):
        load_model(folder)


def test_hub_names_are_told_from_folders_and_offline_is_a_clear_error(monkeypatch, tmp_path):
    assert is_hub_name("HuggingFaceTB/SmolLM2-135M") and is_hub_name("gpt2")
    assert not is_hub_name("shakespeare") and not is_hub_name(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="SmolLM2-135M.*could not reach") as caught:
        load_model("HuggingFaceTB/SmolLM2-135M")
    assert "shakespeare" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
