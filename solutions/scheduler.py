"""The scheduler: at every step, which requests run and how many of their tokens (vLLM v1's
`Scheduler`; nano-vllm's `scheduler.py` is the same module, simpler: it runs prefills and
decodes in separate steps).

There is no prefill phase and decode phase: each request is a count of computed tokens
chasing its count of known tokens, and a step gives each running request as many tokens as the
step's budget (`max_num_batched_tokens`) allows: one for a request that is decoding, a chunk for
one that is still reading its prompt (chunked prefill: a long prompt never stalls the decodes
beside it for a whole step). Running requests go first, oldest first; what budget is left admits
waiting requests, as long as there are blocks for them and at most `max_num_seqs` run.

When a running request needs a block and none is free, the newest running request is
**preempted**: its blocks are freed and it goes back to the front of the queue, to be computed
again from its tokens (which it keeps) when there is room. Never a crash, never a deadlock: a
request alone always fits, because the engine refuses any request that could not fit the whole
pool.

The scheduler is the one owner of a request's progress (nano-vllm's `postprocess`; vLLM splits
it between `_update_after_schedule` and `update_from_output`): `schedule` admits and preempts,
`update` advances the computed tokens after the model ran, appends the sampled token, decides
the stop and finishes, and `finish` sets the status and frees the blocks, in one call.
"""

from collections import deque
from dataclasses import dataclass, field

from solutions.kv_cache_manager import KVCacheManager
from solutions.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    """One step's plan: who runs and how many tokens, in the order they are laid out."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, num_new)
    admitted: list[Request] = field(default_factory=list)  # from the queue, in this step
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        eos_token_id: int | None = None,
    ):
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.eos_token_id = eos_token_id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # Running requests first, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            # BEGIN SOLUTION
            request = self.running[i]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while self.kv.allocate_slots(request, num_new) is None:
                victim = self.running.pop()  # the newest: it has waited least, lost least
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                out.scheduled.append((request, num_new))
                budget -= num_new
                i += 1
            # END SOLUTION
        # Then the queue, in order, while budget, blocks and seats last. Not after a
        # preemption: the pool is full, and a request admitted now would be preempted next.
        while self.waiting and budget > 0 and not out.preempted:
            # BEGIN SOLUTION
            if len(self.running) >= self.max_num_seqs:
                break
            request = self.waiting[0]
            computed, num_cached = self.kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_cached, budget)
            if self.kv.allocate_slots(request, num_new, computed) is None:
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = request.num_cached_tokens = num_cached
            self.running.append(request)
            out.scheduled.append((request, num_new))
            out.admitted.append(request)
            budget -= num_new
            # END SOLUTION
        return out

    def _preempt(self, request: Request) -> None:
        if request in self.running:
            raise ValueError(
                f"request {request.request_id} is preempted while still in self.running: take "
                "it out of running first (pop it)"
            )
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def update(self, out: SchedulerOutput, sampled: list[int]) -> list[tuple[Request, list[int]]]:
        """After the model ran the plan `out`: each scheduled request has its tokens computed;
        one that computed its last known token takes its sampled token (`sampled`, in the
        plan's order) and finishes if it stops. Returns each request with its new tokens."""
        tokens = iter(sampled)
        advanced = []
        for request, num_new in out.scheduled:
            request.num_computed_tokens += num_new
            if request.num_computed_tokens < request.num_tokens:  # a prompt chunk: no token yet
                advanced.append((request, []))
                continue
            token = next(tokens)
            request.output_token_ids.append(token)
            reason = self.stop_reason(request, token)
            if reason is not None:
                self.finish(request, reason)
            advanced.append((request, [token]))
        if next(tokens, None) is not None:
            raise ValueError(f"{len(sampled)} sampled tokens, more than the requests that sample")
        return advanced

    def append_forced(self, request: Request, tokens: list[int]) -> None:
        """Tokens the request's constraint forces (chapter 9's jump-forward), appended without
        sampling: the next step computes them with the last sampled token, in one pass, as a
        prompt chunk is computed. The engine never forces past `max_tokens`."""
        request.output_token_ids.extend(tokens)
        if tokens and len(request.output_token_ids) >= request.params.max_tokens:
            self.finish(request, "length")

    def stop_reason(self, request: Request, token: int) -> str | None:
        """vLLM's reasons: "stop" at an end-of-text (unless `ignore_eos`), "length" at
        `max_tokens`."""
        if token == self.eos_token_id and not request.params.ignore_eos:
            return "stop"
        if len(request.output_token_ids) >= request.params.max_tokens:
            return "length"
        return None

    def finish(self, request: Request, reason: str, error: str | None = None) -> None:
        """End a request (finished, aborted or refused): its status and reason set, taken out
        of the queue or the running requests, its blocks given back at once."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        self.kv.forget(request)
        request.status, request.finish_reason, request.error = (
            RequestStatus.FINISHED, reason, error
        )  # fmt: skip
