"""Beam search: follow the `num_beams` most likely continuations instead of one token at a time.

Scores are sums of log-probabilities (no length penalty), which is what HF `generate` computes
with `num_beams=..., length_penalty=0.0`; the tests check token for token that both agree.
"""

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float, Int
from rich.console import Console
from rich.table import Table
from torch import Tensor, nn

from solutions import checks


def banned_ngram_tokens(
    tokens: Int[Tensor, "beam seq"], ngram_size: int, d_vocab: int
) -> Bool[Tensor, "beam d_vocab"]:
    """For each beam, the tokens that would repeat an n-gram already in it.

    The next token t is banned when (the last ngram_size - 1 tokens) + t already occurs
    somewhere in the sequence, prompt included (HF's `no_repeat_ngram_size`).
    """
    n_beams, seq = tokens.shape
    banned = torch.zeros(n_beams, d_vocab, dtype=torch.bool, device=tokens.device)
    # BEGIN SOLUTION
    if seq < ngram_size:
        return banned  # not one complete n-gram yet
    ngrams = tokens.unfold(dimension=1, size=ngram_size, step=1)  # [beam, n_ngrams, ngram_size]
    prefix = tokens[:, seq - (ngram_size - 1) :]  # the n-1 tokens the next one would extend
    # An n-gram whose first n-1 tokens equal the prefix: its last token must not come next.
    # (For ngram_size 1 the prefix is empty and matches everything: no token may repeat.)
    matches = (ngrams[:, :, :-1] == prefix[:, None, :]).all(dim=-1)  # [beam, n_ngrams]
    beam_index, ngram_index = matches.nonzero(as_tuple=True)
    banned[beam_index, ngrams[beam_index, ngram_index, -1]] = True
    return banned
    # END SOLUTION


def top_continuations(
    logprob_sums: Float[Tensor, "beam"],
    tokens: Int[Tensor, "beam seq"],
    logits: Float[Tensor, "beam d_vocab"],
    k: int,
    no_repeat_ngram_size: int | None = None,
) -> tuple[Float[Tensor, "beam_times_k"], Int[Tensor, "beam_times_k seq_plus_1"]]:
    """The k best one-token continuations of every beam, given the logits of its next token:
    their scores and tokens, the k continuations of beam 0 first (best first), then beam 1's."""
    # BEGIN SOLUTION
    logprobs = logits.float().log_softmax(dim=-1)
    if no_repeat_ngram_size:
        banned = banned_ngram_tokens(tokens, no_repeat_ngram_size, logits.shape[-1])
        # Banned after the softmax, as HF does: the other tokens keep their log-probs.
        logprobs = logprobs.masked_fill(banned, float("-inf"))
    top = logprobs.topk(k, dim=-1)
    new_sums = (logprob_sums[:, None] + top.values).flatten()
    new_tokens = torch.cat(
        [tokens.repeat_interleave(k, dim=0), top.indices.flatten()[:, None]], dim=1
    )
    return new_sums, new_tokens
    # END SOLUTION


@dataclass
class BeamsBase:
    """A set of sequences of equal length, each with the sum of its tokens' log-probabilities:
    what every kind of beams shares, their size and the ways to look at them."""

    model: nn.Module
    tokenizer: Any
    logprob_sums: Float[Tensor, "beam"]
    tokens: Int[Tensor, "beam seq"]
    # What every `print` showed, in order: a verbose search leaves its running beams here, and
    # chapter 3 draws them as a tree. Clear it before the search you want to draw.
    printed: ClassVar[list[list[tuple[float, Tensor]]]] = []

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to_list(self) -> list[tuple[float, Int[Tensor, "seq"]]]:
        """(score, tokens) for each beam, in the current order."""
        return [(s.item(), t) for s, t in zip(self.logprob_sums, self.tokens, strict=True)]

    def logprobs_and_completions(self) -> list[tuple[float, str]]:
        """(score, decoded text) for each beam, in the current order."""
        return [(s, self.tokenizer.decode(t)) for s, t in self.to_list()]

    def print(self, title: str = "Beams", max_chars: int = 80) -> None:
        """A rich table of the beams: score and the end of each text (also kept in `printed`)."""
        BeamsBase.printed.append(self.to_list())
        table = Table(title=title, show_lines=True)
        table.add_column("logprob sum", justify="right")
        table.add_column(f"text (its last {max_chars} characters)")
        for score, text in self.logprobs_and_completions():
            shown = text if len(text) <= max_chars else "…" + text[-max_chars:]
            table.add_row(f"{score:.3f}", repr(shown)[1:-1])
        Console().print(table)


@dataclass
class Beams(BeamsBase):
    """Beams that can grow (`generate`) and be pruned (`filter`)."""

    def __getitem__(self, index) -> "Beams":
        """The beams picked by an index, a slice, or a tensor of indices, as new `Beams`."""
        return Beams(self.model, self.tokenizer, self.logprob_sums[index], self.tokens[index])

    @torch.inference_mode()
    def generate(self, k: int, no_repeat_ngram_size: int | None = None) -> "Beams":
        """Every beam's k most likely one-token continuations: k * len(self) new beams, the k
        continuations of beam 0 first. With `no_repeat_ngram_size`, continuations that would
        repeat an n-gram get a log-probability of -inf."""
        logits = self.model(self.tokens[:, -self.model.cfg.n_ctx :])[:, -1]
        logprob_sums, tokens = top_continuations(
            self.logprob_sums, self.tokens, logits, k, no_repeat_ngram_size
        )
        return Beams(self.model, self.tokenizer, logprob_sums, tokens)

    def filter(self, num_beams: int) -> tuple["Beams", "Beams"]:
        """Rank the beams by score, best first. Returns
        - continuing: the best `num_beams` beams that do not end in the end-of-text token;
        - finished: the beams among the best `num_beams` that do end in it.
        Both keep the ranking order."""
        eos = self.tokenizer.eos_token_id
        # BEGIN SOLUTION
        order = self.logprob_sums.argsort(descending=True, stable=True)
        ends_in_eos = self.tokens[order, -1] == eos
        # Finished beams leave the race, so up to num_beams others keep it going; a finished
        # beam only counts if it was good enough to be among the best num_beams.
        continuing = order[~ends_in_eos][:num_beams]
        in_top = torch.arange(len(order), device=order.device) < num_beams
        finished = order[ends_in_eos & in_top]
        return self[continuing], self[finished]
        # END SOLUTION


def start_beam_search(
    model: nn.Module,
    tokenizer,
    prompt: str,
    num_return_sequences: int,
    num_beams: int,
    max_new_tokens: int,
    no_repeat_ngram_size: int | None,
    beams_class: type[Beams],
) -> Beams:
    """Check `beam_search`'s arguments, then return its start: one beam, the prompt, score 0."""
    checks.integer("num_beams", num_beams, low=1)
    checks.integer("max_new_tokens", max_new_tokens, low=1)
    checks.integer(
        f"num_return_sequences (num_beams={num_beams})", num_return_sequences, 1, num_beams
    )
    if no_repeat_ngram_size is not None:
        checks.integer("no_repeat_ngram_size (None: off)", no_repeat_ngram_size, low=1)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    model.eval()
    device = next(model.parameters()).device
    prompt_tokens = torch.tensor([tokenizer.encode(prompt)], device=device)
    return beams_class(model, tokenizer, torch.zeros(1, device=device), prompt_tokens)


@torch.inference_mode()
def beam_search(
    model: nn.Module,
    tokenizer,
    prompt: str,
    num_return_sequences: int,
    num_beams: int,
    max_new_tokens: int,
    no_repeat_ngram_size: int | None = None,
    early_stopping: bool = False,
    verbose: bool = False,
    beams_class: type[Beams] = Beams,
) -> list[tuple[float, Int[Tensor, "seq"]]]:
    """The `num_return_sequences` best sequences (score, tokens) found by beam search, best
    first. A sequence finishes at the end-of-text token or after `max_new_tokens`.

    Stopping rules: with `early_stopping=True`, stop as soon as `num_beams` sequences have
    finished; with `False`, stop once no running beam can still beat the worst of them
    (log-probabilities are negative, so a running beam's score can only fall).
    `beams_class` is the kind of `Beams` to search with; chapter 4 passes one with a cache.
    """
    beams = start_beam_search(
        model, tokenizer, prompt, num_return_sequences, num_beams, max_new_tokens,
        no_repeat_ngram_size, beams_class,
    )  # fmt: skip
    finished: list[tuple[float, Tensor]] = []  # (score, tokens), best first
    # BEGIN SOLUTION
    for step in range(max_new_tokens):
        # num_beams + 1 per beam: even if one of a beam's continuations is EOS, it can still
        # supply num_beams continuing candidates, so no good candidate is missed.
        candidates = beams.generate(num_beams + 1, no_repeat_ngram_size)
        beams, newly_finished = candidates.filter(num_beams)
        finished = sorted(finished + newly_finished.to_list(), key=lambda b: -b[0])[:num_beams]
        if verbose:
            beams.print(title=f"step {step + 1}: running beams")
        if len(finished) == num_beams and (
            early_stopping or beams.logprob_sums.max().item() <= finished[-1][0]
        ):
            break
    else:
        # Out of tokens: the beams still running compete with the finished ones.
        finished = sorted(finished + beams.to_list(), key=lambda b: -b[0])[:num_beams]
    # END SOLUTION
    return finished[:num_return_sequences]
