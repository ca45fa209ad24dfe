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
"""

from collections import deque
from dataclasses import dataclass, field

from solutions.kv_cache_manager import KVCacheManager
from solutions.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, num_new)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int):
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
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
                self.kv.cache_blocks(request, request.num_computed_tokens + num_new)
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
            # Named now: a request admitted after it in this same step can share its blocks.
            self.kv.cache_blocks(request, num_cached + num_new)
            self.running.append(request)
            out.scheduled.append((request, num_new))
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

    def finish(self, request: Request) -> None:
        """Take a finished (or aborted) request out, and give its blocks back at once."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        self.kv.forget(request)
