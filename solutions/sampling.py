"""Sampling: turning a model's logits into the next token, and a loop that writes text.

Every function works on a batch of logits, one row per sequence, so that the same code serves
one prompt, many prompts at once (chapter 4), and the statistical tests, which draw thousands
of samples in one call. `generator` is a `torch.Generator`: pass one to make sampling
reproducible without touching the global random state.
"""

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm

from solutions import checks


def greedy_search(logits: Float[Tensor, "batch d_vocab"]) -> Int[Tensor, "batch"]:
    """The most likely token of each row (the lowest id among exact ties)."""
    # BEGIN SOLUTION
    return logits.argmax(dim=-1)
    # END SOLUTION


def apply_temperature(
    logits: Float[Tensor, "batch d_vocab"], temperature: float
) -> Float[Tensor, "batch d_vocab"]:
    """Logits divided by the temperature: below 1 sharpens the distribution, above 1 flattens it."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 here (0 means greedy), got {temperature!r}")
    # BEGIN SOLUTION
    return logits / temperature  # the same T for every logit of every row
    # END SOLUTION


def apply_frequency_penalty(
    input_ids: Int[Tensor, "batch seq"],
    logits: Float[Tensor, "batch d_vocab"],
    freq_penalty: float,
    mask: Bool[Tensor, "batch seq"] | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """Subtract `freq_penalty` times the number of times each token occurs in its row's input.
    Where `mask` is given, only the positions where it is True count (padding does not)."""
    batch, d_vocab = logits.shape
    # BEGIN SOLUTION
    # One bincount for the whole batch: shift row b's ids by b * d_vocab so rows do not mix.
    offsets = torch.arange(batch, device=input_ids.device)[:, None] * d_vocab
    weights = None if mask is None else mask.flatten().to(logits.dtype)
    counts = torch.bincount(
        (input_ids + offsets).flatten(), weights=weights, minlength=batch * d_vocab
    )
    return logits - freq_penalty * counts.view(batch, d_vocab).to(logits.dtype)
    # END SOLUTION


def sample_basic(
    logits: Float[Tensor, "batch d_vocab"], generator: torch.Generator | None = None
) -> Int[Tensor, "batch"]:
    """One token per row, drawn from softmax(logits)."""
    # BEGIN SOLUTION
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    # END SOLUTION


def filter_top_k(logits: Float[Tensor, "batch d_vocab"], k: int) -> Float[Tensor, "batch d_vocab"]:
    """Set to -inf every logit below the row's k-th largest; ties with it are all kept."""
    # BEGIN SOLUTION
    kth_largest = logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))
    # END SOLUTION


def sample_top_k(
    logits: Float[Tensor, "batch d_vocab"], k: int, generator: torch.Generator | None = None
) -> Int[Tensor, "batch"]:
    """One token per row, drawn from the k most likely tokens, renormalised."""
    # BEGIN SOLUTION
    return sample_basic(filter_top_k(logits, k), generator)
    # END SOLUTION


def filter_top_p(
    logits: Float[Tensor, "batch d_vocab"], top_p: float, min_tokens_to_keep: int = 1
) -> Float[Tensor, "batch d_vocab"]:
    """Keep the smallest set of most likely tokens whose probabilities sum to at least `top_p`
    (and at least `min_tokens_to_keep` tokens); set every other logit to -inf."""
    # BEGIN SOLUTION
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # A token is needed while the more likely tokens before it have not yet reached top_p:
    # their mass is the running total one place back. (Not `cumulative - p`: that subtraction
    # rounds, and can land just under top_p when the tokens before reach it exactly.)
    before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=-1)
    remove_sorted = before >= top_p
    remove_sorted[:, :min_tokens_to_keep] = False
    # Undo the sort: position order[b, i] of the original row gets remove_sorted[b, i].
    remove = remove_sorted.scatter(dim=-1, index=order, src=remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
    # END SOLUTION


def sample_top_p(
    logits: Float[Tensor, "batch d_vocab"],
    top_p: float,
    min_tokens_to_keep: int = 1,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch"]:
    """One token per row, drawn from the top-p ("nucleus") set, renormalised."""
    # BEGIN SOLUTION
    return sample_basic(filter_top_p(logits, top_p, min_tokens_to_keep), generator)
    # END SOLUTION


def check_sampling_args(
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_tokens_to_keep: int = 1,
    frequency_penalty: float = 0.0,
) -> tuple[bool, bool]:
    """(top-k on, top-p on), after a clear ValueError for any argument out of range. Samplers
    call it before generating anything, so a bad argument fails even if no token is asked for."""
    checks.temperature(temperature)
    checks.number("frequency_penalty", frequency_penalty)
    if top_k is not None:
        checks.integer("top_k (0 or None: off)", top_k, low=0)
    if top_p is not None:
        checks.number("top_p", top_p, low=0.0, high=1.0)
    checks.integer("min_tokens_to_keep", min_tokens_to_keep, low=1)
    use_top_k = bool(top_k)
    use_top_p = top_p is not None and top_p < 1.0
    if use_top_k and use_top_p:
        raise ValueError("top_k and top_p cannot be used together: choose one")
    return use_top_k, use_top_p


def sample_next_token(
    input_ids: Int[Tensor, "batch seq"],
    logits: Float[Tensor, "batch d_vocab"],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_tokens_to_keep: int = 1,
    frequency_penalty: float = 0.0,
    generator: torch.Generator | None = None,
    attention_mask: Bool[Tensor, "batch seq"] | None = None,
) -> Int[Tensor, "batch"]:
    """The next token of each row. The order follows HF `generate`: the penalty, then the
    temperature (0 means greedy), then top-k or top-p. `top_k=0` or `None` and `top_p=1.0` or
    `None` switch those filters off, as in HF. `attention_mask` (False at padding) keeps
    padding out of the penalty's counts."""
    use_top_k, use_top_p = check_sampling_args(
        temperature, top_k, top_p, min_tokens_to_keep, frequency_penalty
    )
    if input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if logits.ndim != 2 or input_ids.ndim != 2 or input_ids.shape[0] != logits.shape[0]:
        raise ValueError(
            f"expected input_ids [batch, seq] and logits [batch, d_vocab] with the same batch, "
            f"got {tuple(input_ids.shape)} and {tuple(logits.shape)}"
        )

    logits = logits.float()  # sampling in float32 whatever the model computed in
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    if frequency_penalty != 0:
        logits = apply_frequency_penalty(input_ids, logits, frequency_penalty, attention_mask)
    if temperature == 0:
        return greedy_search(logits)
    logits = apply_temperature(logits, temperature)
    if use_top_k:
        return sample_top_k(logits, top_k, generator)
    if use_top_p:
        return sample_top_p(logits, top_p, min_tokens_to_keep, generator)
    return sample_basic(logits, generator)


def prompt_ids(prompt, tokenizer, d_vocab: int) -> Int[Tensor, "seq"]:
    """The prompt (a string, a list of token ids or a 1-D tensor of them) as a 1-D tensor of
    valid token ids, or a clear ValueError."""
    if isinstance(prompt, str):
        ids = torch.tensor(tokenizer.encode(prompt), dtype=torch.long)
    elif isinstance(prompt, Tensor):
        if prompt.dtype not in (torch.int32, torch.int64) or prompt.ndim != 1:
            raise ValueError(
                f"a tensor prompt must be 1-D integer token ids, got dtype {prompt.dtype} "
                f"and shape {tuple(prompt.shape)}"
            )
        ids = prompt.long()
    elif isinstance(prompt, list | tuple):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise ValueError("a list prompt must hold integer token ids")
        ids = torch.tensor(prompt, dtype=torch.long)
    else:
        raise ValueError(f"prompt must be a string or token ids, got {type(prompt).__name__}")
    if ids.numel() == 0:
        raise ValueError("prompt must not be empty: the model needs at least one token")
    if not 0 <= int(ids.min()) <= int(ids.max()) < d_vocab:
        raise ValueError(f"prompt token ids must lie in [0, d_vocab={d_vocab})")
    return ids


class SamplerBase:
    """What every sampler of the course shares and no exercise is about: it holds the model,
    checks every argument before the first token, and returns the result in the prompt's form
    (a string in, a string out; token ids in, token ids out)."""

    sample_next_token = staticmethod(sample_next_token)

    def __init__(self, model: nn.Module, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = model.cfg

    def _start(
        self, prompt, max_tokens_generated: int, seed: int | None, sampling_kwargs: dict
    ) -> tuple[Int[Tensor, "seq"], torch.Generator | None]:
        """The checked prompt ids on the model's device, and the seeded generator. Every
        argument is checked here, before the first token: also when none is asked for."""
        self.model.eval()
        input_ids = prompt_ids(prompt, self.tokenizer, self.cfg.d_vocab)
        checks.integer("max_tokens_generated", max_tokens_generated, low=0)
        check_sampling_args(**sampling_kwargs)
        device = next(self.model.parameters()).device
        generator = None if seed is None else torch.Generator(device).manual_seed(seed)
        return input_ids.to(device), generator

    def _finish(self, prompt, input_ids: Int[Tensor, "seq"], verbose: bool) -> str | Tensor:
        """The result in the prompt's form: text for a string prompt, else token ids."""
        if verbose:
            print()
        if isinstance(prompt, str):
            return self.tokenizer.decode(input_ids)
        return input_ids.cpu()


class TransformerSampler(SamplerBase):
    """Generates text from a model that maps tokens [batch, posn] to logits [batch, posn, vocab].

    `sampler.sample("ROMEO.\\n", max_tokens_generated=50, temperature=0.8)` returns the prompt
    and its continuation as a string; give it token ids instead and it returns token ids.
    """

    @torch.inference_mode()
    def sample(
        self,
        prompt: str | list[int] | Int[Tensor, "seq"],
        max_tokens_generated: int = 100,
        verbose: bool = False,
        progress: bool = False,
        seed: int | None = None,
        stop_at_eos: bool = True,
        **kwargs,
    ) -> str | Int[Tensor, "seq"]:
        """Generate up to `max_tokens_generated` tokens after the prompt, one at a time.

        `kwargs` go to `sample_next_token` (temperature, top_k, top_p, frequency_penalty, ...).
        The model reads at most its last `n_ctx` tokens. Generation stops early at the end-of-
        text token (included in the output) unless `stop_at_eos=False`. `verbose` prints each
        token as it comes; `progress` shows a progress bar; `seed` makes the run reproducible.
        """
        input_ids, generator = self._start(prompt, max_tokens_generated, seed, kwargs)
        eos = self.tokenizer.eos_token_id
        # BEGIN SOLUTION
        for _ in tqdm(range(max_tokens_generated), disable=not progress, desc="sampling"):
            logits = self.next_logits(input_ids)
            # The penalty counts every token so far, also those the model can no longer see.
            next_token = self.sample_next_token(
                input_ids[None], logits, generator=generator, **kwargs
            )
            input_ids = torch.cat([input_ids, next_token])
            if verbose:
                print(self.tokenizer.decode(next_token), end="", flush=True)
            if stop_at_eos and next_token.item() == eos:
                break
        # END SOLUTION
        return self._finish(prompt, input_ids, verbose)

    def next_logits(self, input_ids: Int[Tensor, "seq"]) -> Float[Tensor, "1 d_vocab"]:
        """The model's logits for the token after `input_ids`, the whole text so far. The one
        step a faster sampler changes: chapter 4's keeps a cache and is otherwise this class."""
        # BEGIN SOLUTION
        # The model has n_ctx learned positions: it reads the most recent n_ctx tokens.
        return self.model(input_ids[None, -self.cfg.n_ctx :])[:, -1]
        # END SOLUTION
