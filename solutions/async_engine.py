"""AsyncEngine: chapter 8's engine behind a web server (vLLM's `AsyncLLM`, whose
`OutputProcessor` is the bridge below).

The engine is not thread-safe and need not be: one asyncio task, on the web server's event
loop, owns it and steps it while requests are unfinished. The handlers of the web requests run
on the same loop and never touch the engine. They talk to the loop through two kinds of queue:

- the **inbox**, one for the whole engine: a handler puts a new request or an abort in it and
  goes on. The loop empties it between two steps, never during one, so a step always sees an
  engine that no one else changes. (A signal handler, which Python may run in the middle of a
  step, puts its abort there too.)
- a **stream** per request: after each step the loop turns the step's outputs into text and
  puts each request's new text in its stream, where its handler waits for it.

A step blocks the event loop while it runs; after it, the loop lets the handlers run (they write
the step's text to their clients and queue what has arrived), then steps again. A thread of its
own for the engine would let the two overlap on paper, but on a machine of few cores the engine
and the handlers then spend their time handing Python's GIL to each other, and the engine steps
slower than alone.

The bridge (`step`, `advance`) is the one place where the engine and the streams meet. Turning
tokens into text is less obvious than it looks. A token is a few bytes, not always a whole
character (an accented letter may be split over two tokens), so text is decoded a few tokens at
a time and a piece that ends in the middle of a character waits for the next token. And a stop
string ("\\n\\n", "ROMEO:") is the server's business, not the engine's (the engine stops at
end-of-text and `max_tokens`; so does vLLM's, whose detokenizer checks the stop strings): a stop
string can end in a token that comes after the one where it began, so the last few characters
are held back until it is known that no stop string starts there. A request that meets a stop
string is aborted in the engine right away, which is safe there: the loop is between steps.

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
import queue
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from solutions.engine import LLMEngine
from solutions.request import RequestOutput
from solutions.sampling_params import SamplingParams


@dataclass
class Delta:
    """What a stream receives after a step: its new text, the tokens written so far, and, in
    its last delta, why it finished ("stop", "length", "abort"; "error" with `error` said)."""

    text: str
    num_output_tokens: int
    finish_reason: str | None = None
    error: str | None = None


class Detokenizer:
    """A request's output tokens as text, a few tokens at a time: each call decodes the tokens
    from `prefix` on (a few before the new ones, so that a token decodes in its context) and
    returns what they add to the text, or nothing while the text ends in the middle of a
    character (U+FFFD, the replacement character, at its end). Decoding the whole output at
    every step would give the same text, at a cost that grows with its length (70 us for 250
    tokens of the shipped tokenizer, 1.5 us for 10). Special tokens (end-of-text) are left out,
    as OpenAI's and vLLM's servers leave them out."""

    def __init__(self, tokenizer):
        # A fast tokenizer's own decoder: the wrapper around it costs 6 times more on 10 tokens.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = backend.decode if backend is not None else tokenizer.decode
        self.ids: list[int] = []
        self.prefix = 0  # where the window decoded at each call starts
        self.read = 0  # the tokens whose text has been returned

    def add(self, new_ids: list[int], last: bool = False) -> str:
        """The text that `new_ids` add (all of what is left when `last`)."""
        self.ids.extend(new_ids)
        before = self._decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        after = self._decode(self.ids[self.prefix :], skip_special_tokens=True)
        if len(after) <= len(before) or (after.endswith("\ufffd") and not last):
            return ""  # nothing new yet, or the last character is not whole
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]


@dataclass(eq=False)
class RequestStream:
    """One request as the server sees it: what it asked for, its queue of deltas (read by its
    handler on `loop`), and the engine loop's record of its text."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    # Written by the engine's loop only.
    detokenizer: Detokenizer | None = None
    text: str = ""  # every character decoded so far, up to a stop string
    sent: int = 0  # how many of them are in the stream already
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

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.streams: dict[str, RequestStream] = {}  # the unfinished ones: the loop's own
        self.closing = False  # after abort_all, every new request is aborted at once
        self.failed: str | None = None  # the traceback of a step that raised: no more steps
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
            except Exception:  # the engine's state is unknown now: no more steps; say why
                self.failed = traceback.format_exc()
                self._deliver([(s, self._error_delta()) for s in self.streams.values()])
                self.streams.clear()
            for _ in range(self.YIELDS):
                await asyncio.sleep(0)  # the handlers write the text and queue new requests

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
            stream.detokenizer = Detokenizer(self.tokenizer)
            self.streams[stream.request_id] = stream
            self.engine.add_request(stream.request_id, stream.prompt_ids, stream.params)
        elif kind == "abort" and self.failed is None:
            self.engine.abort_request(command[1])  # reported by the next step
        elif kind == "abort_all":
            self.closing = True
            for request_id in self.streams:
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
        inbox's commands, step the engine once, and give each request that advanced its new
        text (`advance`)."""
        while True:
            try:
                self._apply(self.inbox.get_nowait())
            except queue.Empty:
                break
        if not self._busy():
            return
        deltas = []
        for output in self.engine.step():
            stream = self.streams.get(output.request_id)
            if stream is None:  # ended at a stop string: the engine now reports its abort
                continue
            delta = self.advance(stream, output)
            if delta is not None:
                deltas.append((stream, delta))
        self._deliver(deltas)

    def advance(self, stream: RequestStream, output: RequestOutput) -> Delta | None:
        """The delta that `output` (one engine step's news of the request) makes: the new text
        that is sure (held back: a character not yet whole, and the last characters while a
        stop string could start in them), or, when the request ends, all of its text up to a
        stop string, with the reason. None when there is nothing to send."""
        finished = output.finished
        stream.text += stream.detokenizer.add(output.new_token_ids, last=finished)
        reason = output.finish_reason if finished else None
        hits = [i for i in (stream.text.find(s) for s in stream.stop) if i >= 0]
        if hits:  # the text ends before the stop string; the request ends now
            stream.text, reason = stream.text[: min(hits)], "stop"
            if not finished:
                self.engine.abort_request(stream.request_id)  # between steps: safe here
        if reason is None:
            hold = max(map(len, stream.stop), default=1) - 1
            end = max(stream.sent, len(stream.text) - hold)
        else:
            end = len(stream.text)
            del self.streams[stream.request_id]
        text, stream.sent = stream.text[stream.sent : end], end
        if not text and reason is None:
            return None
        return Delta(text, len(output.output_token_ids), reason, output.error)

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
