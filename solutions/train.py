"""Training a language model: the loss, one optimisation step, evaluation, and the loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from solutions.schedule import lr_factor


def lm_loss(
    logits: Float[Tensor, "batch posn d_vocab"], targets: Int[Tensor, "batch posn"]
) -> Float[Tensor, ""]:
    """Mean cross-entropy (in nats) of the next-token predictions over every position."""
    # BEGIN SOLUTION
    log_probs = logits.log_softmax(dim=-1)
    # The log-probability the model gave to the token that actually came next.
    correct = log_probs.gather(dim=-1, index=targets.unsqueeze(-1)).squeeze(-1)
    return -correct.mean()
    # END SOLUTION


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    x: Int[Tensor, "batch posn"],
    y: Int[Tensor, "batch posn"],
    grad_clip: float = 1.0,
) -> float:
    """One optimisation step on the batch (x, y); returns the loss before the update."""
    # BEGIN SOLUTION
    model.train()
    loss = lm_loss(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    # Clipping the global gradient norm tames the rare batch whose gradient is huge.
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()  # the schedule moves once per optimizer step
    return loss.item()
    # END SOLUTION


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, max_batches: int | None = None) -> float:
    """Mean next-token loss over the loader's batches (every token weighs the same)."""
    was_training = model.training
    # BEGIN SOLUTION
    model.eval()  # no dropout in our models, but a habit worth keeping
    total, count = 0.0, 0
    for i, (x, y) in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        # Weight each batch by its number of tokens: the last batch may be smaller.
        total += lm_loss(model(x), y).item() * y.numel()
        count += y.numel()
    model.train(was_training)
    return total / count
    # END SOLUTION


class TiedUnembed(nn.Module):
    """Unembedding that reuses the token embedding: W_U = W_E^T, as GPT-2 does.

    Tying saves d_vocab * d_model parameters and makes the model loadable by
    `GPT2LMHeadModel` with its default `tie_word_embeddings=True`.
    """

    def __init__(self, embed: nn.Module):
        super().__init__()
        self.embed = [embed]  # a list, so the embedding is not registered twice

    def forward(
        self, normalized_resid_final: Float[Tensor, "batch posn d_model"]
    ) -> Float[Tensor, "batch posn d_vocab"]:
        return normalized_resid_final @ self.embed[0].W_E.T


def tie_embeddings(model: nn.Module) -> nn.Module:
    model.unembed = TiedUnembed(model.embed)
    return model


@dataclass
class TrainingArgs:
    batch_size: int = 32
    n_steps: int = 2000
    max_lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_batches: int = 20
    sample_every: int = 500
    seed: int = 0


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    samples: list[tuple[int, str]] = field(default_factory=list)
    seconds: float = 0.0


def make_optimizer(model: nn.Module, args: TrainingArgs) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: decaying gains and biases hurts, helps nothing."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.max_lr, betas=(0.9, 0.95))


def train(
    model: nn.Module,
    train_data: Dataset,
    val_data: Dataset,
    args: TrainingArgs,
    sample: Callable[[nn.Module], str] | None = None,
    progress: bool = True,
) -> History:
    """Train for args.n_steps steps, evaluating and sampling now and then."""
    from tqdm.auto import tqdm

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(train_data, batch_size=args.batch_size, shuffle=True, generator=gen)
    val_loader = DataLoader(val_data, batch_size=args.batch_size)
    optimizer = make_optimizer(model, args)
    schedule = partial(
        lr_factor,
        warmup_steps=min(args.warmup_steps, args.n_steps),  # short smoke runs too
        total_steps=args.n_steps,
        min_lr_ratio=args.min_lr_ratio,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    history = History()
    start = time.perf_counter()
    batches = iter(loader)
    bar = tqdm(range(args.n_steps), disable=not progress, desc="training")
    for step in bar:
        try:
            x, y = next(batches)
        except StopIteration:  # a new epoch, reshuffled
            batches = iter(loader)
            x, y = next(batches)
        lr = optimizer.param_groups[0]["lr"]
        loss = train_step(model, optimizer, scheduler, x, y, args.grad_clip)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {step}: lower max_lr?")
        history.steps.append(step)
        history.train_loss.append(loss)
        history.lr.append(lr)
        last = step == args.n_steps - 1
        if (step + 1) % args.eval_every == 0 or last:
            history.eval_steps.append(step + 1)
            history.val_loss.append(evaluate(model, val_loader, args.eval_batches))
            bar.set_postfix(loss=f"{loss:.3f}", val=f"{history.val_loss[-1]:.3f}")
        if sample is not None and ((step + 1) % args.sample_every == 0 or last):
            history.samples.append((step + 1, sample(model)))
            if progress:
                bar.write(f"--- step {step + 1} ---\n{history.samples[-1][1]}\n")
    history.seconds = time.perf_counter() - start
    return history


@torch.no_grad()
def greedy_continuation(model: nn.Module, tokenizer, prompt: str, n_tokens: int = 40) -> str:
    """A quick look at what the model has learnt (chapter 3 does sampling properly)."""
    was_training = model.training
    model.eval()
    n_ctx = model.cfg.n_ctx
    tokens = torch.tensor([tokenizer.encode(prompt)])
    for _ in range(n_tokens):
        logits = model(tokens[:, -n_ctx:])
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    model.train(was_training)
    return tokenizer.decode(tokens[0])
