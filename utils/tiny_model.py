"""A tiny random GPT-2 for the tests of the course machinery itself.

Built locally in seconds (its own small tokenizer, random weights from a fixed seed) and cached,
so the loaders, the converters and the grading reference are tested offline on a model that
is not the shipped one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from utils.paths import cache_dir

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
    from transformers import GPT2Config, GPT2LMHeadModel

    from utils.tokenizer import train_bpe

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fast = train_bpe(tiny_tokenizer_texts(), vocab_size)
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
