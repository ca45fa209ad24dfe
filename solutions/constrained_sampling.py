"""Constrained sampling: chapter 3's sampler, every token drawn from the tokens a regex allows.

`ConstrainedSampler` is a subclass of chapter 3's `TransformerSampler` that changes one method,
`next_logits`: the model's logits for the next token come back masked, so the sampling loop,
the penalty, temperature, top-k and top-p of chapter 3 run unchanged, after the mask. Each call
to `sample` is one request with its own `Guide`; the index is built once per constraint and
shared.
"""

from jaxtyping import Float, Int
from torch import Tensor

from solutions.sampling import TransformerSampler
from solutions.token_index import Guide, TokenIndex
from solutions.token_mask import mask_logits, token_mask


class ConstrainedSampler(TransformerSampler):
    """`ConstrainedSampler(model, tokenizer, index).sample(prompt, ...)`: the text generated
    after the prompt matches the index's regex once it ends with end-of-text."""

    def __init__(self, model, tokenizer, index: TokenIndex):
        super().__init__(model, tokenizer)
        self.index = index

    def sample(self, prompt, max_tokens_generated: int = 100, **kwargs):
        self.guide = Guide(self.index)  # a new request starts at the constraint's beginning
        self.n_seen: int | None = None  # how many tokens of the text the guide has read
        return super().sample(prompt, max_tokens_generated, **kwargs)

    def next_logits(self, input_ids: Int[Tensor, "seq"]) -> Float[Tensor, "1 d_vocab"]:
        """The model's logits for the next token, -inf at every token the constraint refuses."""
        logits = super().next_logits(input_ids)
        # BEGIN SOLUTION
        # The guide reads the tokens accepted since the last call (none the first time: the
        # prompt is not part of the constrained text), then says what may come next.
        if self.n_seen is not None:
            for token in input_ids[self.n_seen :].tolist():
                self.guide.advance(token)
        self.n_seen = len(input_ids)
        mask = token_mask(self.guide.allowed(), logits.shape[-1], logits.device)
        return mask_logits(logits, mask[None])
        # END SOLUTION
