"""Models for the course: a reference model for grading, and the loader notebooks use.

Everything here works offline. Until chapter 2 ships the course's own trained Shakespeare
model, the reference is a small GPT-2 with seeded random weights and a byte-level BPE
tokenizer trained on a few paragraphs of text, both built locally in seconds.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from utils import REPO_ROOT

TINY_MODEL_VERSION = "tiny-random-gpt2-v1"

# Training text for the tiny tokenizer: written for this course, enough to learn common merges.
_TINY_TEXT = """\
A language model reads a sequence of tokens and predicts the next one. Each token is a small
piece of text: a word, part of a word, a space followed by a word, or a single byte. The model
turns every token into a vector, lets the vectors at different positions talk to each other
through attention, refines each of them with a small neural network, and finally scores every
token in the vocabulary. Those scores are called logits. A softmax turns the logits into
probabilities, and sampling from those probabilities writes the next token of the text.
To generate a paragraph, the model appends the token it chose and reads the longer sequence
again. Greedy search always picks the most likely token; temperature sharpens or flattens the
distribution; top-k and top-p sampling cut away the unlikely tail before sampling. Beam search
keeps several candidate continuations and extends the best of them. A cache of keys and values
avoids recomputing the past at every step, and speculative decoding lets a small draft model
propose tokens that the large model checks in one pass.
"""


def tiny_tokenizer_texts() -> list[str]:
    lines = _TINY_TEXT.splitlines()
    return [_TINY_TEXT] * 4 + lines


def build_tiny_gpt2(path: str | Path, seed: int = 0, vocab_size: int = 400) -> Path:
    """Write a small GPT-2 (HF format: config, safetensors, tokenizer files) to `path`.

    Every parameter is random and non-trivial (biases and LayerNorm weights included), so a
    learner who drops a bias or a LayerNorm scale cannot match the reference by luck.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    eos = "<|endoftext|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tiny_tokenizer_texts(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=eos, eos_token=eos, unk_token=eos, pad_token=eos
    )
    fast.save_pretrained(path)

    config = GPT2Config(
        vocab_size=len(fast),
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=fast.eos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=True,
    )
    gen = torch.Generator().manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(0.1 * noise)
    model.save_pretrained(path)
    return path


def cache_dir() -> Path:
    """Where built models are cached: $COURSE_CACHE, else .cache/ in the repository."""
    return Path(os.environ.get("COURSE_CACHE", REPO_ROOT / ".cache"))


def tiny_model_dir() -> Path:
    """The tiny reference model, built on first use and cached."""
    path = cache_dir() / "models" / TINY_MODEL_VERSION
    if not (path / "model.safetensors").exists():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        build_tiny_gpt2(tmp)
        # Build aside, then rename: a half-written model is never seen by another process.
        if path.exists():
            shutil.rmtree(tmp)
        else:
            tmp.replace(path)
    return path


@dataclass
class Reference:
    """The grading reference: one HF GPT-2 seen three ways."""

    bridge: object  # transformer_lens TransformerBridge, HookedTransformer-compatible
    hf_model: object  # transformers GPT2LMHeadModel
    tokenizer: object  # transformers tokenizer
    params: dict[str, torch.Tensor]  # weights in HookedTransformer naming (blocks.0.attn.W_Q ...)
    path: Path

    @property
    def cfg(self):
        return config_from_hf(self.hf_model.config)


def config_from_hf(hf_config):
    """The course's Config for an HF GPT2Config."""
    from solutions.config import Config

    return Config(
        d_model=hf_config.n_embd,
        layer_norm_eps=hf_config.layer_norm_epsilon,
        d_vocab=hf_config.vocab_size,
        init_range=hf_config.initializer_range,
        n_ctx=hf_config.n_positions,
        d_head=hf_config.n_embd // hf_config.n_head,
        d_mlp=hf_config.n_inner or 4 * hf_config.n_embd,
        n_heads=hf_config.n_head,
        n_layers=hf_config.n_layer,
    )


def load_reference(path: str | Path | None = None) -> Reference:
    """Boot the transformer-lens 4 bridge on an HF GPT-2 directory, fully offline.

    Cached per directory: graders and notebooks share one copy within a process.
    """
    return _load_reference(Path(path if path is not None else tiny_model_dir()).resolve())


@functools.cache
def _load_reference(path: Path) -> Reference:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf_model = GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers(str(path), hf_model=hf_model, tokenizer=tokenizer)
    bridge.eval()
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    params = {k: v.detach().clone() for k, v in bridge.get_params().items()}
    return Reference(
        bridge=bridge, hf_model=hf_model, tokenizer=tokenizer, params=params, path=path
    )


def load_weights(model: torch.nn.Module, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Copy HookedTransformer-named weights into `model`, with a readable error on mismatch."""
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(params))
    if missing:
        raise ValueError(
            f"the reference has no weights for {missing[:5]}: name your parameters as in the "
            "course (W_Q, b_Q, W_E, W_pos, w and b for LayerNorm...)"
        )
    with torch.no_grad():
        for name, param in own.items():
            if param.shape != params[name].shape:
                raise ValueError(
                    f"{name} has shape {tuple(param.shape)} but the reference weight has "
                    f"shape {tuple(params[name].shape)}"
                )
            param.copy_(params[name])
    return model
