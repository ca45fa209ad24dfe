"""The shipped models, the converters and the one loader every notebook uses."""

import json
import os
import subprocess
import sys
import time
import traceback

import pytest
import torch

from tests.support import model_metrics
from utils.convert import demo_to_hf, hf_config
from utils.models import GPT2_MODELS, SHIPPED, hub_reachable, load_hf, load_model, load_reference
from utils.paths import MODELS_DIR
from utils.timing import patient

PROMPT = "ROMEO.\nBut soft, what light through yonder window breaks?"


@pytest.mark.parametrize("name", GPT2_MODELS)
def test_shipped_model_three_way_logits(name):
    """DemoTransformer, GPT2LMHeadModel and the transformer-lens bridge agree on the weights."""
    demo, tokenizer = load_model(name)
    reference = load_reference(MODELS_DIR / name)
    tokens = torch.tensor([tokenizer.encode(PROMPT)])
    with torch.no_grad():
        ours = demo(tokens)
        hf = reference.hf_model(tokens).logits
        bridge = reference.bridge(tokens)
    assert (ours - hf).abs().max() <= 1e-4
    assert (ours - bridge).abs().max() <= 1e-4


@pytest.mark.parametrize("name", GPT2_MODELS)
def test_shipped_model_loads_without_missing_or_unexpected_weights(name):
    from transformers import GPT2LMHeadModel

    _, info = GPT2LMHeadModel.from_pretrained(MODELS_DIR / name, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    config = json.loads((MODELS_DIR / name / "config.json").read_text())
    assert config.get("tie_word_embeddings", True) and config["n_positions"] >= 256


def test_shipped_llama_model_matches_hf_llama():
    """The course's LlamaTransformer and HF's LlamaForCausalLM agree on the shipped weights, and
    HF loads the folder with no weight missing or left over."""
    from transformers import LlamaForCausalLM

    ours, tokenizer = load_model("shakespeare-llama")
    hf, info = LlamaForCausalLM.from_pretrained(
        MODELS_DIR / "shakespeare-llama", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert hf.config.num_key_value_heads < hf.config.num_attention_heads  # grouped-query
    assert hf.config.tie_word_embeddings
    tokens = torch.tensor([tokenizer.encode(PROMPT)] * 2)
    with torch.no_grad():
        assert (ours(tokens) - hf.eval()(tokens).logits).abs().max() <= 1e-4


def test_shipped_models_fit_the_size_budget():
    # Three models in float32: 10.5 MB each for the two of 2.6 M parameters, 3.6 for the draft.
    files = [p for name in SHIPPED for p in (MODELS_DIR / name).iterdir()]
    assert sum(p.stat().st_size for p in files) <= 32 * 2**20


def test_shipped_models_share_a_tokenizer():
    first, *others = (MODELS_DIR / name / "tokenizer.json" for name in SHIPPED)
    assert all(other.read_bytes() == first.read_bytes() for other in others)


def test_main_model_beats_draft_and_bigram():
    main, draft = model_metrics("shakespeare"), model_metrics("shakespeare-draft")
    assert main["val_loss_nats_per_token"] < draft["val_loss_nats_per_token"]
    assert main["val_loss_nats_per_token"] < main["bigram_val_loss_nats_per_token"]


def test_llama_model_is_the_main_models_size_on_the_same_data():
    """The Llama model's loss compares architectures only if size, data and schedule match."""
    main, llama = model_metrics("shakespeare"), model_metrics("shakespeare-llama")
    assert abs(llama["n_parameters"] / main["n_parameters"] - 1) < 0.005
    for same in ("training", "train_tokens", "val_tokens", "validation_plays", "train_stride"):
        assert llama[same] == main[same], same
    assert llama["val_loss_nats_per_token"] < llama["bigram_val_loss_nats_per_token"]


def test_converters_round_trip_on_a_real_shape_gpt2(tmp_path):
    """The conversion path of load_model('gpt2'), offline: a random GPT-2 small, saved."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config()).eval()  # 124M parameters, the shape of real GPT-2 small
    hf.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(MODELS_DIR / "shakespeare").save_pretrained(tmp_path)
    demo, _ = load_model(tmp_path)
    cfg = demo.cfg
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.d_vocab) == (768, 12, 12, 50257)
    tokens = torch.randint(0, cfg.d_vocab, (1, 12))
    with torch.no_grad():
        assert (demo(tokens) - hf(tokens).logits).abs().max() <= 1e-4
    back = demo_to_hf(demo.state_dict(), cfg)
    original = hf.state_dict()
    for key, value in back.items():
        assert torch.equal(value, original[key]), key


def test_demo_to_hf_refuses_an_untied_unembedding():
    from solutions import Config, DemoTransformer

    cfg = Config(d_model=8, d_vocab=10, n_ctx=4, d_head=4, d_mlp=16, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="W_U"):
        demo_to_hf(DemoTransformer(cfg).state_dict(), cfg)
    hf_config(cfg)  # a valid config converts


def test_gpt2_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="shakespeare") as caught:
        load_hf("gpt2")
    # The learner reads the course's message, not a chained traceback of HF's internals.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert len(traceback.format_exception(caught.value)) < 30


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="name must be one of"):
        load_model("shakespeare-large")


def test_offline_is_decided_per_call(monkeypatch):
    """Loading the shipped models (as grading does) must not switch the hub off for the rest of
    the process, and 'gpt2' offline fails fast, with the way out."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    code = (
        "import os; from utils.models import load_model, load_reference; load_reference(); "
        "load_model(); print(os.environ.get('HF_HUB_OFFLINE'), "
        "os.environ.get('TRANSFORMERS_OFFLINE'))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["None", "None"], done.stdout + done.stderr[-2000:]

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not hub_reachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    start = time.monotonic()
    assert not hub_reachable()
    with pytest.raises(RuntimeError, match="shakespeare"):
        load_hf("gpt2")
    took = time.monotonic() - start
    assert took < patient(10), "offline must fail fast, not after minutes of retries"


def test_a_trained_model_saved_as_mine_loads_back_by_name(tmp_path, monkeypatch):
    """Chapter 2 saves the learner's (tied) model; chapters 3-4 load it with load_model('mine')."""
    from solutions import Config, DemoTransformer
    from solutions.train import tie_embeddings
    from utils.models import save_model

    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    _, tokenizer = load_model("shakespeare-draft")
    cfg = Config(d_model=32, n_heads=2, d_head=16, d_mlp=64, n_layers=1, n_ctx=16,
                 d_vocab=len(tokenizer))  # fmt: skip
    torch.manual_seed(0)
    mine = tie_embeddings(DemoTransformer(cfg)).eval()
    with pytest.raises(ValueError, match="chapter 2 saves"):
        load_model("mine")
    assert save_model(mine, tokenizer) == tmp_path / "models" / "mine"
    loaded, loaded_tokenizer = load_model("mine")
    tokens = torch.tensor([tokenizer.encode("ROMEO.\nWhat")])
    with torch.no_grad():
        assert torch.allclose(loaded(tokens), mine(tokens), atol=1e-5)
    assert loaded_tokenizer.encode("ROMEO.") == tokenizer.encode("ROMEO.")
    with pytest.raises(ValueError, match="name_or_path"):
        save_model(mine, tokenizer, "shakespeare")
