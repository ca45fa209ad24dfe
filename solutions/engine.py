"""LLMEngine: requests in, tokens out, one step at a time (vLLM's `LLMEngine`, nano-vllm's
`llm_engine.py`). A step reads as four lines: the scheduler plans it, the model runs once over
all of it, a token is sampled for each request that reached its end, and the scheduler updates
the requests (computed tokens, new tokens, stops, finished ones freed). Chapter 9 adds two: the
masks of the requests' constraints applied to the logits before sampling, and each constrained
request's matcher reading its new token.

    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=16)
    engine.add_request("a", "ROMEO.\\n", SamplingParams(temperature=0.8, max_tokens=20, seed=1))
    while engine.has_unfinished_requests():
        for output in engine.step():
            print(output.request_id, output.new_token_ids, output.finished)

The engine serves chapter 1's GPT-2 model or chapter 7's Llama model alike: `model_runner` picks
the forward pass of the model's architecture (solutions/architectures.py), and nothing else in
the engine knows which it is.

The engine is one process on one device, on purpose: what engines do past one machine
(tensor and pipeline parallelism, prefill and decode on separate machines, cache-aware routing)
is the chapter's last section.
"""

import math
from dataclasses import dataclass, field

import torch
from jaxtyping import Float
from torch import Tensor, nn

from solutions import checks
from solutions.architectures import model_runner
from solutions.kv_cache_manager import KVCacheManager
from solutions.paged_attention import PagedKVCache, prepare_inputs
from solutions.request import Request, RequestOutput
from solutions.sampling import sample_next_token
from solutions.sampling_params import SamplingParams
from solutions.scheduler import Scheduler, SchedulerOutput
from solutions.structured_outputs import JUMP_FORWARD, StructuredOutputManager


@dataclass
class EngineStats:
    """The engine's report (vLLM's `SchedulerStats`), what anyone watching the engine reads
    (a benchmark, a server's health check) instead of its scheduler and pool: counts over every
    step, read from each step's plan; the engine's state after its last change (a step, a
    request added or aborted), set by the engine; and what the last step did, for a timeline:
    request id -> ("prefill", tokens of its prompt or of a recompute), ("decode", 1) or
    ("preempted", 0)."""

    # Counts over every step.
    steps: int = 0
    tokens_computed: int = 0  # prompt and output tokens the model read (a recompute counts)
    prompt_tokens_computed: int = 0
    prompt_tokens_queried: int = 0  # looked up in the prefix cache at admission (its queries)
    prompt_tokens_cached: int = 0  # found there, not computed (its hits)
    preemptions: int = 0
    blocks_reused: int = 0  # blocks handed out again after being freed
    # The state now.
    running: int = 0
    waiting: int = 0
    blocks_in_use: int = 0  # held by some request
    blocks_free: int = 0  # in the free queue (cached ones too: they can be evicted)
    running_table_blocks: int = 0  # in the running requests' tables (shared: once per holder)
    running_computed_tokens: int = 0  # the running requests' tokens with keys and values
    last_step: dict[str, tuple[str, int]] = field(default_factory=dict)

    def record(self, plan: "SchedulerOutput", prefix_caching: bool = True) -> None:
        """Count a step's plan, before it runs (a request's computed tokens are where the step
        starts)."""
        self.preemptions += len(plan.preempted)
        self.last_step = {r.request_id: ("preempted", 0) for r in plan.preempted}
        self.steps += bool(plan.scheduled)
        for request in plan.admitted:
            self.prompt_tokens_queried += request.num_tokens if prefix_caching else 0
            self.prompt_tokens_cached += request.num_cached_tokens
        for request, num_new in plan.scheduled:
            start, prompt = request.num_computed_tokens, len(request.prompt_token_ids)
            self.tokens_computed += num_new
            self.prompt_tokens_computed += max(0, min(num_new, prompt - start))
            decode = num_new == 1 and start >= prompt
            self.last_step[request.request_id] = ("decode", 1) if decode else ("prefill", num_new)

    def observe(self, scheduler: "Scheduler", kv: "KVCacheManager") -> None:
        """Set the state now from the scheduler and the pool (the engine calls it after each
        change; whoever reads the report changes nothing)."""
        self.running, self.waiting = len(scheduler.running), len(scheduler.waiting)
        self.blocks_free = kv.pool.num_free_blocks
        self.blocks_in_use = len(kv.pool.blocks) - self.blocks_free
        self.blocks_reused = kv.blocks_reused
        self.running_table_blocks = sum(len(r.block_ids) for r in scheduler.running)
        self.running_computed_tokens = sum(r.num_computed_tokens for r in scheduler.running)


def sample_requests(requests: list[Request], logits: Float[Tensor, "R d_vocab"]) -> list[int]:
    """The next token of each request (row i of `logits` is request i's), by chapter 3's
    rules under the request's own `SamplingParams`, drawn with the request's own generator
    (`request.generator`, None for an unseeded request): its draws do not depend on its
    neighbours. A frequency penalty counts the request's own tokens, prompt and output.
    Greedy rows without a penalty need neither a generator nor their text: one argmax over
    all of them serves them at once."""
    # BEGIN SOLUTION
    is_greedy = [r.params.temperature == 0 and r.params.frequency_penalty == 0 for r in requests]
    greedy = [i for i, g in enumerate(is_greedy) if g]
    tokens = [0] * len(requests)
    if greedy:
        for i, token in zip(greedy, logits[greedy].argmax(dim=-1).tolist(), strict=True):
            tokens[i] = token
    for i, request in enumerate(requests):
        if is_greedy[i]:
            continue
        ids = torch.tensor([request.all_token_ids], device=logits.device)
        token = sample_next_token(
            ids, logits[i : i + 1], generator=request.generator,
            **request.params.sampling_kwargs(),
        )  # fmt: skip
        tokens[i] = int(token[0])
    return tokens
    # END SOLUTION


class LLMEngine:
    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        num_blocks: int = 64,
        block_size: int = 16,
        max_num_batched_tokens: int = 256,
        max_num_seqs: int = 32,
        enable_prefix_caching: bool = True,
        keep_finished: bool = True,
        structured_outputs_backend: str = "auto",
        jump_forward: str | None = None,
    ):
        """`keep_finished=False` forgets a request once the step that reports its end returns:
        a server that runs for days must not keep every request it ever served (vLLM's
        scheduler drops its finished requests too). Kept, they can be inspected after a run.
        `structured_outputs_backend` compiles the requests' constraints (chapter 9): "auto"
        (the index where a regex can say it, xgrammar for the rest), "index" or "xgrammar".
        `jump_forward` appends the tokens a constraint forces without sampling them (SGLang's
        jump-forward): "exact" where exactly one token is allowed, "text" the forced text as
        the tokenizer writes it (see `StructuredOutputManager.forced_tokens`), None not at
        all."""
        if jump_forward not in JUMP_FORWARD:
            raise ValueError(f"jump_forward must be one of {JUMP_FORWARD}, got {jump_forward!r}")
        self.jump_forward = jump_forward
        checks.integer("num_blocks", num_blocks, low=1)
        checks.integer("block_size", block_size, low=1)
        checks.integer("max_num_batched_tokens", max_num_batched_tokens, low=1)
        checks.integer("max_num_seqs", max_num_seqs, low=1)
        for name, flag in (("enable_prefix_caching", enable_prefix_caching),
                           ("keep_finished", keep_finished)):  # fmt: skip
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        self.keep_finished = keep_finished
        self.model, self.tokenizer = model.eval(), tokenizer
        self.n_ctx = model.cfg.n_ctx
        self.block_size, self.num_blocks = block_size, num_blocks
        self.kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
        self.scheduler = Scheduler(
            self.kv, max_num_batched_tokens, max_num_seqs, tokenizer.eos_token_id
        )
        self.runner = model_runner(model)  # the forward pass of the model's architecture
        self.cache = PagedKVCache.allocate(model, num_blocks, block_size)
        self.requests: dict[str, Request] = {}
        self.pending: list[RequestOutput] = []  # errors and aborts, reported by the next step
        self.stats = EngineStats()  # the engine's report: read it, change nothing
        self.stats.observe(self.scheduler, self.kv)
        self.structured = StructuredOutputManager(
            tokenizer, model.cfg.d_vocab, structured_outputs_backend
        )

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams):
        """Queue a request. One the engine cannot serve is not queued: it ends with an error
        in the next step's outputs, and every other request goes on."""
        known = self.requests.get(request_id)
        if not isinstance(request_id, str) or (known is not None and not known.is_finished):
            raise ValueError(
                f"request_id must be a string that no unfinished request has, got {request_id!r}"
            )
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request = Request(request_id, ids, params)
        if params.seed is not None:
            device = self.model.embed.W_E.device
            request.generator = torch.Generator(device).manual_seed(params.seed)
        self.requests[request_id] = request
        error = self.check_request(ids, params)
        if error is None and params.structured_outputs is not None:
            try:  # a cache hit when a server compiled it before handing the request over
                request.matcher = self.structured.compile(params.structured_outputs).matcher()
            except ValueError as refused:
                error = str(refused)
        if error is not None:
            self.scheduler.finish(request, "error", error)  # never queued: nothing to free
            self.pending.append(self._output(request, []))
            return
        self.scheduler.add_request(request)
        self.stats.observe(self.scheduler, self.kv)

    def check_request(self, ids: list[int], params: SamplingParams) -> str | None:
        """Why this engine could never serve a request (its context or its pool is too small,
        a token id is out of range), or None. `add_request` ends such a request with an error;
        a server asks first, to answer a bad request before it reaches the engine. It reads only
        what is fixed when the engine is made: any thread may ask while the engine steps."""
        d_vocab = self.model.cfg.d_vocab
        if not ids:
            return "the prompt is empty: the model needs at least one token"
        if not all(isinstance(t, int) and 0 <= t < d_vocab for t in ids):
            return f"prompt token ids must be integers in [0, d_vocab={d_vocab})"
        too_long = checks.context_problem(len(ids), params.max_tokens, self.n_ctx)
        if too_long is not None:
            return too_long
        longest = checks.positions_read(len(ids), params.max_tokens)
        num_blocks = self.num_blocks
        if math.ceil(longest / self.block_size) > num_blocks:
            return (
                f"the prompt ({len(ids)} tokens) and max_tokens={params.max_tokens} need "
                f"{math.ceil(longest / self.block_size)} blocks of {self.block_size}, more than "
                f"the pool's num_blocks={num_blocks}: it could never run"
            )
        return None

    def abort_request(self, request_id: str) -> None:
        """End a request now: its blocks are free at once; the next step reports it."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return
        self.scheduler.finish(request, "abort")
        self.pending.append(self._output(request, []))
        self.stats.observe(self.scheduler, self.kv)

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache's names (vLLM's `reset_prefix_cache`), only while no request
        holds a block; whether it did."""
        return self.kv.pool.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running or self.pending)

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """One step: schedule, run the model once, sample, update. Returns an output for each
        request that advanced or ended."""
        outputs, self.pending = self.pending, []
        plan = self.scheduler.schedule()
        self.stats.record(plan, self.kv.enable_prefix_caching)
        if plan.scheduled:
            sampling, logits = self._run(plan)
            logits = self.structured.apply(sampling, logits)  # constraints: before sampling
            tokens = sample_requests(sampling, logits)
            for request, new in self.scheduler.update(plan, tokens):
                if request.matcher is not None and not all(map(request.matcher.accept, new)):
                    self.scheduler.finish(request, "error", "the constraint refused a token")
                elif (new and request.matcher is not None and self.jump_forward is not None
                      and not request.is_finished):  # fmt: skip
                    room = request.params.max_tokens - len(request.output_token_ids)
                    forced = self.structured.forced_tokens(request.matcher, self.jump_forward, room)
                    self.scheduler.append_forced(request, forced)
                    new = new + forced
                outputs.append(self._output(request, new))
        self.stats.observe(self.scheduler, self.kv)
        if not self.keep_finished:
            for output in outputs:
                if output.finished:
                    del self.requests[output.request_id]
        return outputs

    def _run(self, plan: "SchedulerOutput") -> tuple[list[Request], Float[Tensor, "S d_vocab"]]:
        """The model over the plan's tokens: the requests that sample in this step (those that
        compute their last known token) and the logits at their last rows."""
        inputs = prepare_inputs(
            [(r.all_token_ids, r.num_computed_tokens, n, r.block_ids) for r, n in plan.scheduled],
            self.block_size,
            self.model.embed.W_E.device,
        )
        samples = [r.num_computed_tokens + n == r.num_tokens for r, n in plan.scheduled]
        last_rows = inputs.query_start[1:] - 1
        at = last_rows[torch.tensor(samples, device=last_rows.device)]
        logits = self.runner.forward(self.cache, inputs, at)
        return [r for (r, _), s in zip(plan.scheduled, samples, strict=True) if s], logits

    @staticmethod
    def _output(request: Request, new: list[int]) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=new,
            output_token_ids=list(request.output_token_ids),
            finished=request.is_finished,
            finish_reason=request.finish_reason,
            error=request.error,
        )


def generate(
    engine: LLMEngine, prompts: list[str | list[int]], params: SamplingParams | list
) -> list[RequestOutput]:
    """Run every prompt to its end (each with its own params, or all with one); the final
    outputs, in the prompts' order."""
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"params: one per prompt ({len(prompts)}), got {len(params)}")
    first = len(engine.requests)  # ids no earlier request of this engine has
    ids = [f"generate-{first + i}" for i in range(len(prompts))]
    for request_id, prompt, p in zip(ids, prompts, params, strict=True):
        engine.add_request(request_id, prompt, p)
    final: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                final[output.request_id] = output
    return [final[request_id] for request_id in ids]
