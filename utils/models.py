"""Models for the course: the one loader every notebook uses, and the grading reference.

Everything here works offline. The course ships its own Shakespeare models (models/, HF GPT-2
format, trained by `course train`); real GPT-2 small comes from the HF hub when asked for.
A tiny random GPT-2, built locally in seconds, serves the machinery tests.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from utils import REPO_ROOT

MODELS_DIR = REPO_ROOT / "models"  # the course's shipped models, HF GPT-2 format
SHIPPED = ("shakespeare", "shakespeare-draft")


def cache_dir() -> Path:
    """Where the course caches what it builds or fetches: $COURSE_CACHE, else the user's cache
    folder ($XDG_CACHE_HOME or ~/.cache) under transformer-course/. Never inside the repo."""
    if "COURSE_CACHE" in os.environ:
        return Path(os.environ["COURSE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "transformer-course"


def model_dir(name: str) -> Path:
    """Folder of a shipped model, with a clear error if it is missing."""
    if name not in SHIPPED:
        raise ValueError(f"name must be one of {SHIPPED} (or 'gpt2'), got {name!r}")
    path = MODELS_DIR / name
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"{path} has no weights: `course train` rebuilds them")
    return path


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


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the HF hub answers a TCP connection now: decided per call, never by a setting
    made once for the whole process."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def load_hf(name_or_path: str | Path):
    """(GPT2LMHeadModel, tokenizer) for a shipped model, 'gpt2' from the HF hub, or a folder.

    Folders are read with `local_files_only`: loading one never touches the network."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    if name_or_path == "gpt2":
        online = hub_reachable()
        try:
            # Offline, a copy in the HF cache still works; online, the hub is asked.
            hf = GPT2LMHeadModel.from_pretrained("gpt2", local_files_only=not online)
            tokenizer = AutoTokenizer.from_pretrained("gpt2", local_files_only=not online)
        except OSError as err:
            raise RuntimeError(
                "'gpt2' (GPT-2 small, 124M parameters) is downloaded from the Hugging Face hub "
                "and this machine could not reach it (offline, or HF_HUB_OFFLINE=1 is set). "
                "Everything in the course works with the shipped model: load_model('shakespeare')."
            ) from err
    else:
        path = Path(name_or_path)
        if not path.is_dir():  # a name, not a folder
            path = model_dir(str(name_or_path))
        hf = GPT2LMHeadModel.from_pretrained(path, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return hf.eval(), tokenizer


def load_model(name: str | Path = "shakespeare"):
    """(DemoTransformer, tokenizer): the course's model with weights from an HF GPT-2.

    "shakespeare" (default) and "shakespeare-draft" ship with the course and work offline;
    "gpt2" is the real GPT-2 small from the HF hub (online only); a folder path loads any
    HF GPT-2 checkpoint.
    """
    from solutions.model import DemoTransformer
    from utils.convert import hf_to_demo

    hf, tokenizer = load_hf(name)
    cfg = config_from_hf(hf.config)
    model = DemoTransformer(cfg)
    model.load_state_dict(hf_to_demo(hf.state_dict(), cfg))
    return model.eval(), tokenizer


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


def load_reference(name_or_path: str | Path = "shakespeare") -> Reference:
    """Boot the transformer-lens 4 bridge on a shipped model or an HF GPT-2 folder, offline.

    Cached per folder: graders and notebooks share one copy within a process.
    """
    path = Path(name_or_path)
    if not path.is_dir():
        path = model_dir(str(name_or_path))
    return _load_reference(path.resolve())


@functools.cache
def _load_reference(path: Path) -> Reference:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    hf_model = GPT2LMHeadModel.from_pretrained(
        path, attn_implementation="eager", local_files_only=True
    ).eval()
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


# A tiny random GPT-2 for tests of the machinery itself.

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
