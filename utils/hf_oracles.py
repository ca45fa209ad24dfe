"""Ground truths from Hugging Face `transformers` that the graded tests and a chapter share.

The graded tests compare the learner's code with these (through `tests/graded/_oracles.py`,
which re-exports them), and chapter 3 runs the same comparisons in front of the learner. They
live here rather than in `tests/` because a notebook can import `utils` (an installed package)
but not `tests`; one definition serves both, so the notebook shows exactly what is graded.

Every answer comes from HF's own code (`GPT2LMHeadModel.generate` and the logits processors it
chains), never from the course's `solutions`. The end-of-text id is the HF model's own
(`generation_config.eos_token_id`), which is also the pad id: `generate` pads a beam that ended
early with it, and is told so explicitly rather than warning that no pad id was set.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformers import GPT2LMHeadModel, LogitsProcessor, LogitsProcessorList


def _as_batch(hf_model: GPT2LMHeadModel, ids: Sequence[int] | Tensor) -> Int[Tensor, "1 seq"]:
    """One prompt (a list of ids or a 1-D tensor) as a batch of one on the model's device."""
    return torch.as_tensor(ids, device=hf_model.device).reshape(1, -1)


def hf_greedy(
    hf_model: GPT2LMHeadModel, ids: Sequence[int] | Tensor, max_new_tokens: int
) -> list[int]:
    """The prompt and its greedy continuation by `generate(do_sample=False)`, as a list of ids.

    `generate` stops early at the end-of-text token (and keeps it), as the course's samplers do
    with `stop_at_eos=True`.
    """
    eos = hf_model.generation_config.eos_token_id
    with torch.no_grad():
        out = hf_model.generate(
            _as_batch(hf_model, ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            top_k=None,
            pad_token_id=eos,
        )
    return out[0].tolist()


def hf_beam_search(
    hf_model: GPT2LMHeadModel,
    ids: Sequence[int] | Tensor,
    num_return_sequences: int,
    num_beams: int,
    max_new_tokens: int,
    no_repeat_ngram_size: int | None = None,
    early_stopping: bool = False,
    logits_processor: LogitsProcessorList | None = None,
) -> list[tuple[float, Int[Tensor, "seq"]]]:
    """HF's beam search, in the format of the course's `beam_search`: (score, tokens), best first.

    The arguments are those of the course's `beam_search`. `length_penalty=0.0` makes HF's score
    the plain sum of the new tokens' log-probabilities, the course's score. HF returns the
    sequences as one padded tensor; each is cut here after its first end-of-text token in the
    continuation, where the course's sequences end. `logits_processor` lets a test replace the
    model's log-probabilities with crafted ones, so that HF searches the same tree as the
    learner's code on a crafted model.
    """
    prompt = _as_batch(hf_model, ids)
    eos = hf_model.generation_config.eos_token_id
    with torch.no_grad():
        out = hf_model.generate(
            prompt,
            num_beams=num_beams,
            num_return_sequences=num_return_sequences,
            max_new_tokens=max_new_tokens,
            length_penalty=0.0,
            early_stopping=early_stopping,
            do_sample=False,
            no_repeat_ngram_size=no_repeat_ngram_size,
            pad_token_id=eos,
            eos_token_id=eos,
            output_scores=True,
            return_dict_in_generate=True,
            top_k=None,
            logits_processor=logits_processor,
        )
    n_prompt = prompt.shape[1]
    beams = []
    for sequence, score in zip(out.sequences, out.sequences_scores, strict=True):
        ended = (sequence[n_prompt:] == eos).nonzero()
        end = n_prompt + int(ended[0]) + 1 if len(ended) else len(sequence)
        beams.append((score.item(), sequence[:end]))
    return beams


def hf_kept(
    warper: LogitsProcessor, logits: Float[Tensor, "batch d_vocab"]
) -> Bool[Tensor, "batch d_vocab"]:
    """The tokens an HF logits warper (`TopKLogitsWarper`, `TopPLogitsWarper`) keeps.

    A warper returns -inf at every token it removes; the logits are cloned first because HF's
    warpers may write into their input.
    """
    return torch.isfinite(warper(None, logits.clone()))
