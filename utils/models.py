"""Models for the course: the one loader every notebook uses, the grading reference, and
copying its weights into a module by name.

Everything here works offline. The course ships its own Shakespeare models (models/, HF GPT-2
format, trained by `course train`); real GPT-2 small comes from the HF hub when asked for.
The HF <-> course config table lives in utils/convert.py; the tiny random GPT-2 of the
machinery tests in utils/tiny_model.py.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from utils.paths import MODELS_DIR, cache_dir

SHIPPED = ("shakespeare", "shakespeare-draft", "shakespeare-llama")
GPT2_MODELS = ("shakespeare", "shakespeare-draft")  # the GPT-2 architecture ones (chapters 1-6)


def saved_models_dir() -> Path:
    """Where `save_model` keeps the models a learner trains: in the course's cache, outside the
    repository, so that `git pull` and `course reset` never touch them. `COURSE_SAVED_MODELS`
    moves it (the tests that run chapter 2 do, so that they never replace a learner's model)."""
    if "COURSE_SAVED_MODELS" in os.environ:
        return Path(os.environ["COURSE_SAVED_MODELS"])
    return cache_dir() / "models"


def model_dir(name: str) -> Path:
    """Folder of a shipped model or of one saved with `save_model`, with a clear error."""
    if name in SHIPPED:
        path = MODELS_DIR / name
        if not (path / "model.safetensors").exists():
            raise FileNotFoundError(f"{path} has no weights: `course train` rebuilds them")
        return path
    path = saved_models_dir() / name
    if (path / "model.safetensors").exists():
        return path
    saved = sorted(p.name for p in saved_models_dir().glob("*") if (p / "config.json").exists())
    hint = " (chapter 2 saves the model you train as 'mine')" if name == "mine" else ""
    raise ValueError(
        f"name must be one of {SHIPPED}, 'gpt2', a hub name 'owner/name', a model saved with "
        f"save_model (saved so far: {saved or 'none'}){hint}, or a folder; got {name!r}"
    )


def save_model(model, tokenizer, name_or_path: str | Path = "mine") -> Path:
    """Save a DemoTransformer (tied as in chapter 2, or not) and its tokenizer in HF GPT-2
    format: under `saved_models_dir()` for a name, or in the folder given. Returns the folder;
    `load_model(name_or_path)` loads it back, in any chapter."""
    from utils.convert import to_hf

    if isinstance(name_or_path, str):
        if not name_or_path or name_or_path in (*SHIPPED, "gpt2") or "/" in name_or_path:
            raise ValueError(
                f"name_or_path must be a new name (not {SHIPPED} or 'gpt2') or a folder, "
                f"got {name_or_path!r}"
            )
        out = saved_models_dir() / name_or_path
    else:
        out = Path(name_or_path)
    hf = to_hf(model)  # the HF class of the model's architecture
    out.mkdir(parents=True, exist_ok=True)
    with quiet_loading():
        hf.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return out


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


@contextlib.contextmanager
def quiet_loading():
    """No "Loading weights" (or "Writing model shards") progress bar from transformers inside
    the block: in a notebook it is a widget that viewers without widgets show as
    `0%|  | 0/52`, and for a model this small it says nothing."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def hf_class(path: Path):
    """The HF model class for a checkpoint folder, from its config.json's `model_type`: the
    course's models are GPT-2 (chapters 1-6) or Llama (chapter 7) architectures."""
    import json

    kind = json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("model_type")
    return hf_class_of(kind, f"{path}/config.json")


def hf_class_of(kind: str | None, where: str):
    """The HF model class for a config's `model_type` (read from `where`), or a ValueError: one
    of the architectures the course builds (the registry, solutions/architectures.py)."""
    import transformers

    from utils.convert import hf_conversion

    try:
        return getattr(transformers, hf_conversion(kind).hf_class)
    except ValueError as err:
        raise ValueError(f"{err} (in {where})") from None


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # "owner/name", as the HF hub spells a model


def is_hub_name(name_or_path: str | Path) -> bool:
    """Whether `name_or_path` names a model of the HF hub ("gpt2", "HuggingFaceTB/SmolLM2-135M")
    rather than a shipped model, a saved one or a folder (a folder that exists wins)."""
    if not isinstance(name_or_path, str) or Path(name_or_path).exists():
        return False
    return name_or_path == "gpt2" or HUB_NAME.fullmatch(name_or_path) is not None


def load_from_hub(name: str):
    """(HF model, tokenizer) for a hub name, in float32. Offline, a copy in the HF cache still
    works; online, the hub is asked (and the download shows its progress: that one says
    something). Anything else is a RuntimeError that says what happened and the way on."""
    from transformers import AutoConfig, AutoTokenizer

    online = hub_reachable()
    try:
        config = AutoConfig.from_pretrained(name, local_files_only=not online)
        cls = hf_class_of(getattr(config, "model_type", None), f"{name}'s config.json")
        hf = cls.from_pretrained(name, local_files_only=not online, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=not online)
    except OSError as err:
        said = str(err).splitlines()[0] if str(err) else type(err).__name__
        what = "'gpt2' (GPT-2 small, 124M parameters)" if name == "gpt2" else repr(name)
        if online:
            problem = "and the hub did not give it (is the name spelled as on the hub?)"
        else:
            problem = "and this machine could not reach it (offline, or HF_HUB_OFFLINE=1 is set)"
        raise RuntimeError(
            f"{what} is downloaded from the Hugging Face hub {problem}. Everything in the "
            f"course works with the shipped models, offline: load_model('shakespeare') (the "
            f"shipped models are {', '.join(SHIPPED)}). (Hugging Face said: {said})"
        ) from None  # the message is the whole story: not under 170 lines of HF internals
    return hf, tokenizer


def load_hf(name_or_path: str | Path):
    """(HF model, tokenizer) for a shipped model, a hub name ('gpt2', 'owner/name'; online, or
    in the HF cache), or a folder: GPT2LMHeadModel or LlamaForCausalLM, in float32 (what the
    course computes in, whatever dtype the checkpoint was saved in).

    Folders are read with `local_files_only`: loading one never touches the network."""
    from transformers import AutoTokenizer

    if is_hub_name(name_or_path):
        hf, tokenizer = load_from_hub(name_or_path)
    else:
        path = Path(name_or_path)
        if not path.is_dir():  # a name, not a folder
            path = model_dir(str(name_or_path))
        with quiet_loading():
            hf = hf_class(path).from_pretrained(path, local_files_only=True, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return hf.eval(), tokenizer


def load_model(name: str | Path = "shakespeare"):
    """(model, tokenizer): the course's model with the weights of an HF checkpoint, a
    DemoTransformer for a GPT-2, a LlamaTransformer (chapter 7) for a Llama.

    The shipped models (`SHIPPED`; "shakespeare" is the default) work offline; "gpt2" (GPT-2
    small) and Llama-architecture hub names such as "HuggingFaceTB/SmolLM2-135M" come from the
    HF hub (online, or from the HF cache); a name given to `save_model` ("mine": the model you
    trained in chapter 2) loads what was saved; a folder path loads any HF GPT-2 or Llama
    checkpoint. A Llama whose config asks for what the course's model does not compute (RoPE
    scaling, biases, a sliding window, another activation) is refused with a ValueError.
    """
    from utils.convert import from_hf

    hf, tokenizer = load_hf(name)
    return from_hf(hf), tokenizer  # the course's model of the checkpoint's architecture


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
        from utils.convert import config_from_hf

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

    with quiet_loading():
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        hf_model = GPT2LMHeadModel.from_pretrained(
            path, attn_implementation="eager", local_files_only=True
        ).eval()
        bridge = TransformerBridge.boot_transformers(
            str(path), hf_model=hf_model, tokenizer=tokenizer
        )
    bridge.eval()
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
    params = {k: v.detach().clone() for k, v in bridge.get_params().items()}
    return Reference(
        bridge=bridge, hf_model=hf_model, tokenizer=tokenizer, params=params, path=path
    )


def params_under(params: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The weights under `prefix` ("blocks.0.attn."), with the prefix removed: one layer's
    weights, named as that layer names its own parameters, ready for `load_weights`."""
    return {k.removeprefix(prefix): v for k, v in params.items() if k.startswith(prefix)}


def load_weights(module: torch.nn.Module, params: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Copy HookedTransformer-named weights into `module` by name; returns the module.

    The names must match both ways: a weight the module has no parameter for would be lost,
    and a parameter with no weight would keep its random initial value; either way the module
    would not compute the reference's function. So both, and any shape that differs, raise a
    ValueError that names the parameters, in words a learner can act on.
    """
    cls = type(module).__name__
    own = dict(module.named_parameters())
    missing = sorted(set(params) - set(own))
    unknown = sorted(set(own) - set(params))
    if missing or unknown:
        if not unknown:
            problem = f"has no parameter(s) {_names(missing)}"
        elif not missing:
            problem = f"has parameter(s) {_names(unknown)} that the reference does not"
        else:  # most likely renamed
            problem = f"has no parameter(s) {_names(missing)} but has {_names(unknown)}"
        raise ValueError(f"{cls} {problem}: keep the names from the cell's __init__")
    with torch.no_grad():
        for name, param in own.items():
            if param.shape != params[name].shape:
                raise ValueError(
                    f"{cls}.{name} has shape {tuple(param.shape)}, "
                    f"expected {tuple(params[name].shape)} as in the reference"
                )
            param.copy_(params[name])
    return module


def _names(names: list[str], most: int = 6) -> str:
    """A list of parameter names for a message: the first `most`, and how many more."""
    more = f" (and {len(names) - most} more)" if len(names) > most else ""
    return f"{names[:most]}{more}"
