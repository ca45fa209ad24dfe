"""A request's record: what the engine knows about one prompt on its way through (nano-vllm's
`Sequence`, vLLM's `Request`).

The engine never holds a request's keys and values itself: the request holds `block_ids`, its
block table (the only one: the cache manager reads and writes it), and `num_computed_tokens`, how
many of its tokens already have their keys and values in those blocks. Everything else follows
from these two numbers. The scheduler owns them: it sets them when it admits, preempts, advances
and finishes a request (nano-vllm's `Scheduler.postprocess`). A request whose
`num_computed_tokens` is below its prompt's length is still prefilling (perhaps one chunk per
step); once every token but the newest is computed, each step computes that one and samples the
next.
"""

import enum
from dataclasses import dataclass, field

import torch

from solutions.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued: not admitted yet, or preempted and queued again
    RUNNING = "running"  # holds blocks; scheduled at every step until it finishes
    FINISHED = "finished"


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose keys and values are in the blocks
    block_ids: list[int] = field(default_factory=list)  # the block table
    num_cached_tokens: int = 0  # of those, found in the prefix cache when last admitted
    num_preemptions: int = 0
    finish_reason: str | None = None  # vLLM's words: "stop", "length", "abort"; or "error"
    error: str | None = None
    # The request's own random numbers, on the model's device (the engine seeds it from
    # `params.seed`): its tokens do not depend on the rest of the batch.
    generator: torch.Generator | None = None
    # The request's place in its constraint (chapter 9), None when it has none: it has read
    # exactly the output tokens, so a preemption or a prefix-cache hit leaves it right.
    matcher: object | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED


@dataclass
class RequestOutput:
    """What `LLMEngine.step` says of a request that advanced (or ended) in that step."""

    request_id: str
    new_token_ids: list[int]  # sampled in this step (none for a prefill chunk)
    output_token_ids: list[int]  # every token sampled so far
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
