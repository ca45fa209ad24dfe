"""AsyncEngine: chapter 8's engine behind a web server (vLLM's `AsyncLLM`, whose
`OutputProcessor` is the bridge below).

The engine is not thread-safe and need not be: one asyncio task, on the web server's event
loop, owns it and steps it while requests are unfinished. The handlers of the web requests run
on the same loop and never change the engine: they read its fixed limits
(`LLMEngine.check_request`, which reads nothing a step changes) and its report
(`LLMEngine.stats`, set between steps), and talk to the loop through two kinds of queue:

- the **inbox**, one for the whole engine: a handler puts a new request or an abort in it and
  goes on. The loop empties it between two steps, never during one, so a step always sees an
  engine that no one else changes. (A signal handler, which Python may run in the middle of a
  step, puts its abort there too.)
- a **stream** per request: after each step the loop turns the step's outputs into text and
  puts each request's new text in its stream, where its handler waits for it. The
  `OutputProcessor` keeps each unfinished request's stream with the rest of its state (one
  record per request outside the engine, as vLLM's output processor keeps its queue).

A step blocks the event loop while it runs; after it, the loop lets the handlers run (they write
the step's text to their clients and queue what has arrived), then steps again. A thread of its
own for the engine would let the two overlap on paper, but on a machine of few cores the engine
and the handlers then spend their time handing Python's GIL to each other, and the engine steps
slower than alone.

The bridge is `step`: apply the inbox's commands, step the engine once, hand the outputs to the
`OutputProcessor` (solutions/output_processor.py), which turns them into text cut at stop
strings, abort the requests that met a stop string (the loop is between steps: safe), and put
each delta in its stream.

A step that raises must not stop the server: the loop logs its traceback, ends the requests
that the step ran with an error, and goes on with the others (`_recover`). It cannot tell which
request of the batch broke a pass they shared, so it ends them all; the queued ones were not in
the step and go on. (vLLM's engine core dies instead: `EngineDeadError`, "Unrecoverable", in
vllm/v1/engine/exceptions.py; every request fails until a restart.)

    engine = AsyncEngine(LLMEngine(model, tokenizer, num_blocks=256))
    engine.start()  # on the event loop (the server's startup)
    stream = engine.add_request([464, 318], SamplingParams(max_tokens=20), stop=("\\n",))
    async for delta in stream:  # in a handler, on the same loop
        print(delta.text, end="")
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from solutions.engine import LLMEngine
from solutions.output_processor import Delta, OutputProcessor
from solutions.request import RequestStatus
from solutions.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass(eq=False)
class RequestStream:
    """One request as its handler sees it: what it asked for, and its queue of deltas (read by
    its handler on `loop`)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    # Written by the handler only: it read the last delta.
    done: bool = False

    async def deltas(self) -> AsyncIterator[Delta]:
        """The deltas, as the loop delivers them, up to the last one."""
        while not self.done:
            delta = await self.queue.get()
            self.done = delta.finish_reason is not None
            yield delta

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self.deltas()


class AsyncEngine:
    """An `LLMEngine` stepped by one asyncio task. Handlers call `add_request` (on the loop),
    `abort`, `abort_all` and `call` (from anywhere, a signal handler or another thread too: each
    puts a command in the inbox and wakes the loop); the loop's task alone calls the engine."""

    YIELDS = 3  # turns of the event loop the handlers get between two steps

    def __init__(self, engine: LLMEngine, processor: OutputProcessor | None = None):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        # Each unfinished request's text and stream, the loop's own (chapter 8 hands it the
        # learner's processor).
        self.processor = processor if processor is not None else OutputProcessor(self.tokenizer)
        self.closing = False  # after abort_all, every new request is aborted at once
        # The traceback of a failure that `_recover` could not repair: no more steps.
        self.failed: str | None = None
        self._ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._wakeup: asyncio.Event | None = None
        self._stopping = False

    # ---------------------------------------------------------------- the handlers' side

    def start(self) -> AsyncEngine:
        """Start the loop's task on the running event loop (call it from a coroutine)."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self.closing = self._stopping = False
        self._task = self._loop.create_task(self._run(), name="engine-loop")
        return self

    async def stop(self) -> None:
        """Abort what is left (the aborts are delivered) and end the loop's task."""
        if self._task is None:
            return
        self.abort_all()
        self._post(("stop",))
        await self._task
        self._task = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and self.failed is None

    def add_request(
        self, prompt_ids: list[int], params: SamplingParams, stop: tuple[str, ...] = ()
    ) -> RequestStream:
        """Queue a request; its deltas arrive in the returned stream, on the calling event loop
        (call it from a coroutine). The prompt is checked by the caller: one the engine refuses
        ends with an "error" delta."""
        stream = RequestStream(
            f"cmpl-{next(self._ids)}", list(prompt_ids), params, tuple(stop),
            asyncio.get_running_loop(),
        )  # fmt: skip
        self._post(("add", stream))
        return stream

    def abort(self, request_id: str) -> None:
        """End a request at the next step boundary (its client went away)."""
        self._post(("abort", request_id))

    def abort_all(self) -> None:
        """End every request at the next step boundary, with "abort", and every later one at
        once (a shutdown)."""
        self._post(("abort_all",))

    def call(self, fn: Callable[[LLMEngine], object]) -> concurrent.futures.Future:
        """Run `fn(engine)` in the loop between two steps (to read the engine's state while no
        step changes it); its result comes in the returned future (wait for it from another
        thread, or `await asyncio.wrap_future(...)` on the loop)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._post(("call", fn, future))
        return future

    def _post(self, command: tuple) -> None:
        self.inbox.put(command)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wakeup.set)

    # ---------------------------------------------------------------- the loop's task

    def _busy(self) -> bool:
        return self.failed is None and self.engine.has_unfinished_requests()

    async def _run(self) -> None:
        while not (self._stopping and not self._busy()):
            if self.inbox.empty() and not self._busy():
                self._wakeup.clear()  # idle: sleep until a command comes
                if self.inbox.empty():
                    await self._wakeup.wait()
            try:
                self.step()
            except Exception:
                self._recover(traceback.format_exc())
            for _ in range(self.YIELDS):
                await asyncio.sleep(0)  # the handlers write the text and queue new requests

    def _recover(self, trace: str) -> None:
        """After a step raised (`trace`): log it, end with an error every request that holds
        blocks (the step's: the running ones), forget the prefix cache's names (the failed pass
        may have left the blocks it named half written; no request holds a block now), and end
        every stream whose request the engine no longer has in its queue. If that fails too,
        the engine's state is unknown: no more steps (`failed`), every request ends."""
        log.error("an engine step failed; the requests it ran end with an error\n%s", trace)
        why = trace.strip().splitlines()[-1]
        message = f"the engine failed in a step that ran this request ({why}); see the server's log"
        engine, states = self.engine, self.processor.states
        try:
            # Every request of the engine's came through here: those of `states` it still has.
            ours = [engine.requests[i] for i in states if i in engine.requests]
            held = [r for r in ours if not r.is_finished and r.block_ids]
            for request in held:  # the engine records an abort; their clients get the error
                engine.abort_request(request.request_id)
            if not engine.reset_prefix_cache():
                raise RuntimeError("blocks are still held after every holder ended")
            queued = {r.request_id for r in ours if r.status == RequestStatus.WAITING}
            ended = [i for i in states if i not in queued]
            self._deliver([(states.pop(i).stream, Delta("", 0, "error", message)) for i in ended])
            # Ends the failed step had taken from `pending` to report are lost: forget them here.
            if not engine.keep_finished:
                reported = {output.request_id for output in engine.pending}
                lost = [
                    i for i, r in engine.requests.items() if r.is_finished and i not in reported
                ]
                for request_id in lost:
                    del engine.requests[request_id]
        except Exception:
            self.failed = traceback.format_exc()
            log.error("the engine could not recover: it stops\n%s", self.failed)
            self._deliver([(state.stream, self._error_delta()) for state in states.values()])
            states.clear()

    def _error_delta(self) -> Delta:
        return Delta("", 0, "error", f"the engine failed: {self.failed.strip().splitlines()[-1]}")

    def _apply(self, command: tuple) -> None:
        """One command from the inbox, between two steps."""
        kind = command[0]
        if kind == "add":
            stream = command[1]
            if self.failed is not None or self.closing:
                failed = self._error_delta() if self.failed else Delta("", 0, "abort")
                self._deliver([(stream, failed)])
                return
            self.processor.add_request(stream.request_id, stream.stop, stream)
            self.engine.add_request(stream.request_id, stream.prompt_ids, stream.params)
        elif kind == "abort" and self.failed is None:
            self.engine.abort_request(command[1])  # reported by the next step
        elif kind == "abort_all":
            self.closing = True
            for request_id in self.processor.states:
                self.engine.abort_request(request_id)
        elif kind == "call":
            fn, future = command[1], command[2]
            try:
                future.set_result(fn(self.engine))
            except Exception as err:
                future.set_exception(err)
        elif kind == "stop":
            self._stopping = True

    def step(self) -> None:
        """One turn of the loop, the bridge between the engine and the streams: apply the
        inbox's commands, step the engine once, turn its outputs into deltas, abort the requests
        that met a stop string, and put each delta in its stream."""
        while True:
            try:
                self._apply(self.inbox.get_nowait())
            except queue.Empty:
                break
        if not self._busy():
            return
        outputs, states = self.engine.step(), self.processor.states
        # Each stream, before the processor forgets the requests that finish in this step.
        streams = {
            o.request_id: states[o.request_id].stream for o in outputs if o.request_id in states
        }
        processed = self.processor.process_outputs(outputs)
        for request_id in processed.to_abort:
            self.engine.abort_request(request_id)  # reported by the next step, then ignored
        self._deliver([(streams[i], delta) for i, delta in processed.deltas.items()])

    @staticmethod
    def _deliver(deltas: list[tuple[RequestStream, Delta]]) -> None:
        """Put each delta in its stream: at once on this event loop, through a callback on
        another (one per loop and step, however many requests advanced)."""
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        elsewhere: dict[asyncio.AbstractEventLoop, list] = {}
        for stream, delta in deltas:
            if stream.loop is here:
                stream.queue.put_nowait(delta)
            else:
                elsewhere.setdefault(stream.loop, []).append((stream.queue, delta))
        for loop, items in elsewhere.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is closed: nobody is listening
                pass


def _put_all(items: list[tuple[asyncio.Queue, Delta]]) -> None:
    for q, delta in items:
        q.put_nowait(delta)
