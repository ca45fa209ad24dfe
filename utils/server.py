"""`course serve`: chapter 8's engine behind OpenAI's completions API, as vLLM's `vllm serve`,
SGLang and HF's `transformers serve` put theirs. Any OpenAI client can then use the course's
model:

    course serve                                   # http://127.0.0.1:8000/v1
    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    client.completions.create(model="shakespeare", prompt="ROMEO.\\n", max_tokens=40)

Endpoints: `POST /v1/completions`, `GET /v1/models`, `GET /health`. FastAPI and uvicorn (the
servers of vLLM and SGLang), with server-sent events for `stream=true`. uvicorn picks httptools
(its HTTP parser in C) and uvloop (an event loop on libuv) when they are installed, as they are
with the course (`uvicorn[standard]` is how vLLM gets them): a streamed answer is one event per
token, and the pure-Python parser and loop cost more per event (benchmarks/server.py).

What this module does is the web's side: read a request's JSON, check every field before the
engine sees it (a bad request is answered with OpenAI's error JSON, naming the field, and never
reaches the engine, so it can disturb no other request), hand the request to the loop
(`solutions/async_engine.py`: one task steps the engine; handlers only queue requests and
aborts, and read what no step changes: the engine's limits, `check_request`, and its report,
`stats`) and write its deltas back in OpenAI's shapes. A client that disconnects is aborted at
the next step boundary; a shutdown (SIGINT, SIGTERM) ends every request in flight with
`finish_reason` "abort" (vLLM's word) before the server exits.

The fields: `model`, `prompt` (text or token ids, one prompt), `max_tokens` (16 if left out),
`temperature` (0 is greedy, and so is any temperature below 1e-5, as in vLLM: dividing the
logits by 1e-40 overflows them), `top_p`, `seed`, `stop` (a string or a list of at most 4, as
OpenAI allows, each at most 256 characters: the text ends before the first one and never goes
past it), `stream`, `stream_options.include_usage`, vLLM's `top_k` (-1 or 0: off) and
`ignore_eos`, and a constraint on the answer (chapter 9): vLLM's `structured_outputs` (`json`,
`regex`, `choice`, `grammar`, `json_object`) or OpenAI's `response_format` (`json_object`,
`json_schema`), compiled in a worker thread before the request reaches the engine; a constraint
no backend keeps (an invalid regex, a schema keyword not supported) is a 400 that names it,
never an answer left unconstrained. Refused with a 400 that says why, unless given their
neutral value:
`frequency_penalty` (OpenAI counts only the generated tokens, the course's sampler counts the
prompt's too: refused, so that no client gets a penalty it did not ask for), `presence_penalty`,
`n` and `best_of` above 1 (one choice per request: send several requests, with different
seeds), `echo`, `logprobs`, `logit_bias`, `suffix`; any other field too. `user` is accepted and
ignored. A prompt's text is only text: "<|endoftext|>" typed in it is 13 characters, never the
end-of-text token (HF's `split_special_tokens=True`), so that no client can forge one; a prompt
of token ids may hold any id, that one too.

No one request may stop the server or starve the others:
- a body must be `application/json` (else 415: a web page can send text/plain to a server on
  localhost without the browser asking first) and at most `max_body_bytes` (else 413);
- the JSON is parsed and the prompt tokenized in a worker thread, never on the event loop that
  steps the engine; a prompt text too long for the model's context is refused before it is
  tokenized (a token stands for at most so many bytes, so its bytes bound its tokens);
- at most `max_concurrent_requests` requests are in flight (TGI's name and default, 128);
  beyond them, a 429 with `Retry-After`, and `GET /health` answers 503 "saturated";
- an engine step that raises ends the requests it ran, with the traceback in the log, and the
  engine goes on (solutions/async_engine.py);
- every error, a malformed body's too, is OpenAI's error JSON, with a 4xx for the client's.

`GET /health`: 200 and `{"status": "ok", "requests": N, "max_concurrent_requests": M, "engine":
{...}}` while a new request would be taken; 503 with `"status": "saturated"` (M requests in
flight) or `"engine failed"` otherwise, so that a load balancer's readiness check sends no more.
`engine` is the engine's report as its last step left it (`LLMEngine.stats`): requests running
and waiting, blocks in use and free, preemptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException

from solutions import checks
from solutions.async_engine import AsyncEngine, RequestStream
from solutions.engine import LLMEngine
from solutions.sampling_params import SamplingParams, StructuredOutputsParams

log = logging.getLogger(__name__)

MAX_SEED = 2**63 - 1
MAX_STOP, MAX_STOP_CHARS = 4, 256  # OpenAI's "up to 4 sequences"; TGI's max_stop_sequences is 4
MAX_CONCURRENT_REQUESTS = 128  # TGI's --max-concurrent-requests default
MAX_BODY_BYTES = 2_000_000  # HF text-embeddings-inference's --payload-limit default (2 MB)
SERVED = "POST /v1/completions, GET /v1/models and GET /health"


class APIError(Exception):
    """An answer in OpenAI's error JSON: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, param: str | None = None, code=None,
                 headers: dict | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        error = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return {"error": error}

    def response(self) -> Response:
        # json.dumps escapes what is not ASCII: a lone surrogate a client sent, quoted back in a
        # message, cannot be written as UTF-8 (Starlette's JSONResponse would fail on it).
        return Response(json.dumps(self.body()), self.status, self.headers,
                        media_type="application/json")  # fmt: skip


# ------------------------------------------------------------------------- checking a request


@dataclass
class Completion:
    """A checked request: what the engine runs, and how to answer."""

    prompt_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


# Fields accepted only with the value that asks for nothing (OpenAI's defaults), and why.
NEUTRAL = {
    "frequency_penalty": (
        (None, 0, 0.0),
        "OpenAI's penalty counts only the generated tokens and the course's sampler counts the "
        "prompt's too, so this server does not apply one; send 0 or leave it out",
    ),
    "presence_penalty": ((None, 0, 0.0), "the course's sampler has no presence penalty"),
    "n": ((None, 1), "one choice per request here: send several requests (with different seeds)"),
    "best_of": ((None, 1), "one choice per request here"),
    "echo": ((None, False), "the prompt is not echoed here"),
    "logprobs": ((None,), "log-probabilities are not returned here"),
    "logit_bias": ((None, {}), "logit biases are not applied here"),
    "suffix": ((None, ""), "suffixes (insertion) are not supported here"),
}
FIELDS = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
    "stream_options", "top_k", "ignore_eos", "user", "structured_outputs", "response_format",
    *NEUTRAL,
}  # fmt: skip
STRUCTURED_FIELDS = ("json", "regex", "choice", "grammar", "json_object")  # vLLM's names


class PromptEncoder:
    """Prompt text to token ids, as text only: special tokens' names in it ("<|endoftext|>")
    are split into ordinary tokens (HF's `split_special_tokens=True`), so that a client cannot
    forge an end-of-text in the middle of its prompt. A copy of the fast tokenizer's backend
    does it: HF's `encode(..., split_special_tokens=...)` sets a flag on the tokenizer it shares
    with the engine and the chapters, and a worker thread would race them for it."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            from tokenizers import Tokenizer

            self.backend = Tokenizer.from_str(backend.to_str())
            self.backend.encode_special_tokens = True
        else:
            self.backend, self.tokenizer = None, tokenizer
        # A bound on the bytes one token stands for: each token's string as UTF-8 (a byte-level
        # BPE's "Ġ" is 2 bytes for a space, SentencePiece's "<0xE2>" 6 for one byte), so that a
        # text of B bytes is at least B / max_token_bytes tokens, known before tokenizing it.
        names = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.max_token_bytes = max(len((name or "").encode()) for name in names)

    def __call__(self, text: str) -> list[int]:
        if self.backend is not None:
            return self.backend.encode(text).ids
        return self.tokenizer.encode(text, split_special_tokens=True)


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param)


def _integer(body: dict, name: str, default, low: int, high: int | None = None):
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not (ok and value >= low and (high is None or value <= high)):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(name, f"{name} must be an integer {allowed}, got {_shown(value)}")
    return value


def _number(body: dict, name: str, default, low: float, high: float, low_open: bool = False):
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not (ok and (value > low if low_open else value >= low) and value <= high):
        allowed = f"{'(' if low_open else '['}{low}, {high}]"
        raise _bad(name, f"{name} must be a number in {allowed}, got {_shown(value)}")
    return value


def _boolean(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, f"{name} must be true or false, got {_shown(value)}")
    return value


def _shown(value, limit: int = 80) -> str:
    """A value as a message quotes it: its repr, cut (a client's megabyte stays out of it)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**60 else "a huge integer"
    return text if len(text) <= limit else text[: limit - 5] + " ...)"


def _text(name: str, value: str) -> None:
    """Text must be Unicode that UTF-8 can write: JSON's "\\ud800" is a lone surrogate, which
    no tokenizer takes and no text contains."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _bad(name, f"{name} must be valid Unicode: a lone surrogate "
                   f"({value[err.start]!r}) at character {err.start}") from None  # fmt: skip


def _prompt_ids(prompt, encode: PromptEncoder, d_vocab: int, n_ctx: int) -> list[int]:
    """One prompt: a string, a list of token ids, or a list holding one of those. Refused before
    the work its length costs if it could never fit the model's context."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # OpenAI's batch form, with a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt", "prompt must not be empty: the model needs at least one token")
        _text("prompt", prompt)
        num_bytes = len(prompt.encode("utf-8"))
        at_least = math.ceil(num_bytes / encode.max_token_bytes)
        if at_least > n_ctx:  # with max_tokens=1, a prompt of n_ctx tokens fits
            raise _bad("prompt", f"prompt is too long: its {num_bytes} bytes are at least "
                       f"{at_least} tokens (one stands for {encode.max_token_bytes} bytes at "
                       f"most), more than the model's n_ctx={n_ctx}")  # fmt: skip
        return encode(prompt)
    if not isinstance(prompt, list):
        raise _bad(
            "prompt", f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
        )
    if not prompt:
        raise _bad("prompt", "prompt must not be empty: the model needs at least one token")
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        raise _bad(
            "prompt",
            f"prompt must be one prompt, got a batch of {len(prompt)}: this server takes one "
            "prompt per request (send them as separate requests)",
        )
    if len(prompt) > n_ctx:  # with max_tokens=1, a prompt of n_ctx tokens fits
        raise _bad("prompt", f"prompt is too long: {len(prompt)} token ids, more than the "
                   f"model's n_ctx={n_ctx}")  # fmt: skip
    bad = next((p for p in prompt if not isinstance(p, int) or isinstance(p, bool)), None)
    if bad is not None or any(not 0 <= p < d_vocab for p in prompt):
        shown = bad if bad is not None else next(p for p in prompt if not 0 <= p < d_vocab)
        raise _bad(
            "prompt", f"prompt token ids must be integers in [0, {d_vocab}), got {_shown(shown)}"
        )
    return list(prompt)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", f"stop must be a string or a list of strings, got {_shown(stop)}")
    # Each is searched in the text at every step: their number and length are its cost.
    if len(stops) > MAX_STOP:
        raise _bad("stop", f"stop must hold at most {MAX_STOP} strings, got {len(stops)}")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise _bad("stop", f"stop strings must have 1 to {MAX_STOP_CHARS} characters, got "
                   f"{sorted(map(len, stops))}")  # fmt: skip
    for s in stops:
        _text("stop", s)
    return tuple(stops)


def check_completion(body, model_name: str, engine: LLMEngine,
                     encode: PromptEncoder | None = None) -> Completion:  # fmt: skip
    """The request's fields, checked in OpenAI's terms (and vLLM's for its extra fields), or an
    `APIError` that names the first bad one. The engine's own rules decide what fits: a prompt
    and `max_tokens` within the model's context and within the pool of blocks. It reads nothing
    that a step changes (it compiles a constraint into the engine's cache of them, which a lock
    guards): a worker thread may run it while the engine steps."""
    encode = encode if encode is not None else PromptEncoder(engine.tokenizer)
    if not isinstance(body, dict):
        raise _bad(None, f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise _bad(unknown[0], f"unrecognized request argument supplied: {_shown(unknown[0])}")
    model = body.get("model", model_name)
    if not isinstance(model, str):
        raise _bad("model", f"model must be a string, got {_shown(model)}")
    if model != model_name:
        raise APIError(404, f"The model {_shown(model)} does not exist.", "model",
                       "model_not_found")  # fmt: skip
    for name, (allowed, why) in NEUTRAL.items():
        value = body.get(name)
        if not any(value == a and type(value) is type(a) for a in allowed):
            neutral = f" or {json.dumps(allowed[1])}" if len(allowed) > 1 else " (null)"
            raise _bad(name, f"{name} must be left out{neutral}, got {_shown(value)}: {why}")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _bad("user", f"user must be a string, got {_shown(body['user'])}")
    if "prompt" not in body:
        raise _bad("prompt", "prompt is required")
    d_vocab = engine.model.cfg.d_vocab
    ids = _prompt_ids(body["prompt"], encode, d_vocab, engine.n_ctx)
    max_tokens = _integer(body, "max_tokens", 16, low=1)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _integer(body, "top_k", -1, low=-1, high=d_vocab)
    if top_k > 0 and top_p < 1:
        raise _bad(
            "top_k",
            "top_k and top_p cannot be used together here (the course's sampler applies one "
            "of them): leave one out",
        )
    seed = _integer(body, "seed", None, low=0, high=MAX_SEED)
    stop = _stop(body)
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise _bad("stream_options", "stream_options is only allowed when stream is true")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise _bad(
            "stream_options",
            f"stream_options must be {{'include_usage': bool}}, got {_shown(options)}",
        )
    include_usage = (options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise _bad("stream_options", f"stream_options.include_usage must be true or false, "
                   f"got {_shown(include_usage)}")  # fmt: skip
    constraint = _constraint(body)
    if constraint is not None:
        field, so = constraint
        try:  # compiled here, in the worker thread: the engine's own call is a cache hit
            engine.structured.compile(so)
        except ValueError as error:
            raise _bad(field, str(error)) from None
    params = SamplingParams(
        temperature=float(temperature),  # below 1e-5: greedy (SamplingParams, vLLM's rule)
        top_k=top_k if top_k > 0 else None,
        top_p=float(top_p) if top_p < 1 else None,
        max_tokens=max_tokens,
        seed=seed,
        ignore_eos=_boolean(body, "ignore_eos"),
        structured_outputs=constraint and constraint[1],
    )
    # The engine's rule (context and pool); the prompt is to blame if even one token is too many.
    problem = engine.check_request(ids, params)
    if problem is not None:
        alone = engine.check_request(ids, SamplingParams(max_tokens=1))
        raise _bad("prompt" if alone else "max_tokens", problem)
    return Completion(ids, params, stop, stream, include_usage)


def _constraint(body: dict) -> tuple[str, StructuredOutputsParams] | None:
    """The request's constraint and the field that gave it: vLLM's `structured_outputs`
    (`{"json": ...}`, `{"regex": ...}`, `{"choice": [...]}`, `{"grammar": ...}`,
    `{"json_object": true}`) or OpenAI's `response_format` (`{"type": "json_object"}`,
    `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`; `"text"` is none),
    which vLLM also takes on completions. At most one of the two."""
    so, rf = body.get("structured_outputs"), body.get("response_format")
    if so is not None and rf is not None:
        raise _bad("response_format", "give structured_outputs or response_format, not both")
    if so is not None:
        if not isinstance(so, dict) or set(so) - set(STRUCTURED_FIELDS):
            extra = sorted(set(so) - set(STRUCTURED_FIELDS)) if isinstance(so, dict) else so
            raise _bad("structured_outputs", f"structured_outputs must be an object with one "
                       f"of {list(STRUCTURED_FIELDS)}, got {_shown(extra)}")  # fmt: skip
        try:
            return "structured_outputs", StructuredOutputsParams(**so)
        except ValueError as error:
            raise _bad("structured_outputs", str(error)) from None
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text" and set(rf) == {"type"}:
        return None
    if kind == "json_object" and set(rf) == {"type"}:
        return "response_format", StructuredOutputsParams(json_object=True)
    if kind == "json_schema" and set(rf) == {"type", "json_schema"}:
        spec = rf["json_schema"]
        allowed = {"name", "schema", "strict", "description"}
        if not isinstance(spec, dict) or "schema" not in spec or set(spec) - allowed:
            raise _bad("response_format", "response_format.json_schema must be an object with "
                       f"a schema (and name, strict, description), got {_shown(spec)}")  # fmt: skip
        if spec.get("strict") is False:
            raise _bad("response_format", "strict: false is not served here: every answer "
                       "is kept to its schema")  # fmt: skip
        try:
            return "response_format", StructuredOutputsParams(json=spec["schema"])
        except ValueError as error:
            raise _bad("response_format", str(error)) from None
    raise _bad("response_format", "response_format must be {'type': 'text'}, {'type': "
               "'json_object'} or {'type': 'json_schema', 'json_schema': {...}}, got "
               f"{_shown(rf)}")  # fmt: skip


def _parse(raw: bytes):
    """Strict JSON (RFC 8259): no NaN or Infinity, which Python's parser takes by default."""

    def constant(name: str):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(raw, parse_constant=constant)
    except RecursionError:
        raise APIError(400, "the body is not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError, an int of 4300+ digits
        raise APIError(400, f"the body is not valid JSON: {_shown(str(err), 200)}") from None


# --------------------------------------------------------------------------------- the app


class Admission:
    """Requests in flight, from their admission to their answer's end: at most `limit` (TGI's
    `max_concurrent_requests`). Beyond them a request waits behind all of them for a seat in
    the engine's batch: better to say so at once (429) than to answer after a minute."""

    def __init__(self, limit: int):
        self.limit, self.in_flight = limit, 0

    @property
    def saturated(self) -> bool:
        return self.in_flight >= self.limit

    def check(self) -> None:
        if self.saturated:
            raise APIError(
                429,
                f"the server is saturated: {self.in_flight} requests in flight, its limit "
                f"(max_concurrent_requests={self.limit}); retry later",
                code="server_saturated", headers={"Retry-After": "1"},
            )  # fmt: skip

    def admit(self) -> None:
        self.check()
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, or a 413 as soon as it is known to be longer than `limit` bytes."""
    too_long = APIError(413, f"the body is over the server's limit of {limit} bytes "
                        "(max_body_bytes)", code="request_too_large")  # fmt: skip
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_long
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_long
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(async_engine: AsyncEngine, model_name: str, api_key: str | None = None,
               max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS,
               max_body_bytes: int = MAX_BODY_BYTES):  # fmt: skip
    """The FastAPI app around an `AsyncEngine` (it starts the engine's loop if it is not
    running, and stops it when the server stops)."""
    checks.integer("max_concurrent_requests", max_concurrent_requests, low=1)
    checks.integer("max_body_bytes", max_body_bytes, low=1)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not async_engine.running:
            async_engine.start()
        yield
        await async_engine.stop()

    app = FastAPI(title="course serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.async_engine = async_engine
    engine = async_engine.engine
    encode = PromptEncoder(engine.tokenizer)
    admission = app.state.admission = Admission(max_concurrent_requests)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def api_error(request, err: APIError):
        return err.response()

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):  # unknown paths, wrong methods
        message = f"{err.detail} ({request.method} {request.url.path})"
        if err.status_code == 404:
            message += f": this server serves {SERVED}"
        return APIError(err.status_code, message).response()

    @app.exception_handler(Exception)
    async def server_error(request, err: Exception):  # a bug: logged, and answered in JSON
        log.error("%s %s failed", request.method, request.url.path, exc_info=err)
        return APIError(500, f"the server failed: {type(err).__name__} (its log says more)",
                        code="server_error").response()  # fmt: skip

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not given.startswith("Bearer "):
            raise APIError(401, "no API key: send it as 'Authorization: Bearer KEY'",
                           code="invalid_api_key")  # fmt: skip
        if not hmac.compare_digest(given[len("Bearer ") :].encode(), api_key.encode()):
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")

    @app.get("/health")
    async def health():
        status = ("engine failed" if not async_engine.running else
                  "saturated" if admission.saturated else "ok")  # fmt: skip
        stats = engine.stats  # the engine's report, set by the loop between two steps
        body = {"status": status, "requests": admission.in_flight,
                "max_concurrent_requests": admission.limit,
                "engine": {"running": stats.running, "waiting": stats.waiting,
                           "blocks_in_use": stats.blocks_in_use, "blocks_free": stats.blocks_free,
                           "preemptions": stats.preemptions}}  # fmt: skip
        return Response(json.dumps(body), 200 if status == "ok" else 503,
                        media_type="application/json")  # fmt: skip

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "course",
                "max_model_len": engine.n_ctx}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.api_route("/v1/chat/completions", methods=["GET", "POST"])
    async def chat(request: Request):
        raise APIError(404, "/v1/chat/completions is not served here: this server answers "
                       "OpenAI's completions API only, POST /v1/completions with a prompt (the "
                       "course's models have no chat template)", code="not_found")  # fmt: skip

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            # A page in a browser may send text/plain anywhere, localhost too, without asking
            # first (no CORS preflight); application/json it may not.
            raise APIError(415, f"the body must be sent as Content-Type: application/json, got "
                           f"{_shown(media or None)}", code="unsupported_media_type")  # fmt: skip
        admission.check()  # refused before reading a body it would not serve
        raw = await _read_body(request, max_body_bytes)
        # Parsing and tokenizing take time that grows with the body: in a worker thread, while
        # the event loop steps the engine for everyone else (the tokenizer lets go of the GIL).
        completion = await asyncio.to_thread(
            lambda: check_completion(_parse(raw), model_name, engine, encode)
        )
        if not async_engine.running:
            raise APIError(503, "the engine is not running", code="engine_unavailable")
        admission.admit()
        streamed = False  # a streamed answer releases its admission when it ends
        try:
            stream = async_engine.add_request(
                completion.prompt_ids, completion.params, completion.stop
            )
            header = {"id": stream.request_id, "object": "text_completion",
                      "created": int(time.time()), "model": model_name}  # fmt: skip
            usage = _Usage(len(completion.prompt_ids))
            if completion.stream:
                events = _events(stream, header, usage, completion.include_usage)
                streamed = True
                return EventStream(events, async_engine, stream, admission.release)
            return await _collect(async_engine, stream, request, header, usage)
        finally:
            if not streamed:
                admission.release()

    return app


class _Usage:
    def __init__(self, prompt_tokens: int):
        self.prompt_tokens, self.completion_tokens = prompt_tokens, 0

    def json(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}  # fmt: skip


async def _collect(async_engine, stream: RequestStream, request, header: dict, usage: _Usage):
    """A whole answer, or nothing if the client goes away first (then its request is aborted)."""

    async def read_all():
        texts, last = [], None
        async for delta in stream:
            texts.append(delta.text)
            last = delta
        return "".join(texts), last

    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answer, gone = asyncio.ensure_future(read_all()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not answer.done():
            answer.cancel()
            async_engine.abort(stream.request_id)
    if not answer.done() or answer.cancelled():
        return Response(status_code=499)  # nobody reads it
    text, last = answer.result()
    if last.finish_reason == "error":
        raise APIError(500, last.error or "the engine failed", code="engine_error")
    usage.completion_tokens = last.num_output_tokens
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}
    return {**header, "choices": [choice], "usage": usage.json()}


class EventStream(StreamingResponse):
    """Server-sent events whose request is aborted if the answer ends before its last delta is
    read: the client went away (Starlette then cancels the stream at its next wait, or before it
    starts), or writing to it failed."""

    def __init__(self, events, async_engine: AsyncEngine, stream: RequestStream, on_end):
        super().__init__(events, media_type="text/event-stream")
        self.async_engine, self.stream, self.on_end = async_engine, stream, on_end

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.stream.done:
                self.async_engine.abort(self.stream.request_id)
            self.on_end()


async def _events(stream: RequestStream, header: dict, usage: _Usage, with_usage: bool):
    """Server-sent events: a chunk per delta (OpenAI's `text_completion` chunks, the last one
    with its `finish_reason`), the usage if asked for, then `data: [DONE]`."""
    # A chunk is the same JSON but for its text and reason: written around them, not re-encoded.
    base = {**header, "choices": [{"index": 0, "text": "", "logprobs": None,
                                   "finish_reason": None}]}  # fmt: skip
    if with_usage:
        base["usage"] = None
    head, tail = json.dumps(base).split('"text": "", "logprobs": null, "finish_reason": null')
    async for delta in stream:
        usage.completion_tokens = delta.num_output_tokens
        if delta.finish_reason == "error":
            error = APIError(500, delta.error or "the engine failed", code="engine_error")
            yield f"data: {json.dumps(error.body())}\n\n"
            break
        reason = "null" if delta.finish_reason is None else json.dumps(delta.finish_reason)
        yield (f'data: {head}"text": {json.dumps(delta.text)}, "logprobs": null, '
               f'"finish_reason": {reason}{tail}\n\n')  # fmt: skip
    if with_usage:
        yield f"data: {json.dumps({**header, 'choices': [], 'usage': usage.json()})}\n\n"
    yield "data: [DONE]\n\n"


# ----------------------------------------------------------------------------- running it


class Server(uvicorn.Server):
    """uvicorn's server, whose SIGINT and SIGTERM first end every request in flight with
    "abort" (uvicorn then waits for their answers to be written, and exits)."""

    def __init__(self, app, host: str, port: int, **config):
        super().__init__(uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=10,
                                        **config))  # fmt: skip
        self.async_engine: AsyncEngine = app.state.async_engine

    def handle_exit(self, sig, frame) -> None:
        self.async_engine.abort_all()
        super().handle_exit(sig, frame)


def make_engine(model, tokenizer, max_num_seqs: int = 32, num_blocks: int | None = None,
                block_size: int = 16, keep_finished: bool = False) -> LLMEngine:  # fmt: skip
    """The server's engine: unless `num_blocks` is given, blocks for `max_num_seqs` requests
    at the model's full context, and 512 tokens a step; finished requests forgotten once
    reported, unless `keep_finished` (to inspect them)."""
    if num_blocks is None:
        num_blocks = max_num_seqs * math.ceil(model.cfg.n_ctx / block_size)
    return LLMEngine(model, tokenizer, num_blocks=num_blocks, block_size=block_size,
                     max_num_batched_tokens=512, max_num_seqs=max_num_seqs,
                     keep_finished=keep_finished)  # fmt: skip


def serve(model: str = "shakespeare", host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, threads: int = 1,
          max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS) -> None:  # fmt: skip
    """`course serve`: load the model, start the engine's loop and serve until SIGINT or
    SIGTERM. `threads` is PyTorch's (`torch.set_num_threads`): one by default, see
    `course serve --help` for why."""
    import torch

    from utils.models import load_model

    checks.integer("threads", threads, low=1)
    torch.set_num_threads(threads)
    # The engine's log (a step that failed, with its traceback) beside uvicorn's.
    logging.basicConfig(format="%(levelname)s:     %(name)s: %(message)s", level=logging.INFO)
    loaded, tokenizer = load_model(model)
    async_engine = AsyncEngine(make_engine(loaded, tokenizer))
    app = create_app(async_engine, model, api_key, max_concurrent_requests)
    server = Server(app, host, port)
    print(f"serving {model} on http://{host}:{port}/v1 (OpenAI's completions API; Ctrl+C stops)",
          flush=True)  # fmt: skip
    server.run()


@dataclass
class RunningServer:
    url: str  # the API's base URL, http://host:port/v1
    server: Server  # its handle_exit(signal, None) is what SIGINT or SIGTERM calls
    thread: threading.Thread


@contextlib.contextmanager
def running_server(
    async_engine: AsyncEngine, model_name: str, api_key: str | None = None, host="127.0.0.1",
    max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS, max_body_bytes: int = MAX_BODY_BYTES,
    **uvicorn_config,
) -> Iterator[RunningServer]:  # fmt: skip
    """A server on a free port, in a thread of this process (for tests and benchmarks); stopped
    on leaving. `uvicorn_config` goes to uvicorn's Config (`http="h11", loop="asyncio"`: the
    pure-Python parser and loop)."""
    app = create_app(async_engine, model_name, api_key, max_concurrent_requests, max_body_bytes)
    server = Server(app, host, 0, log_level="warning", access_log=False, **uvicorn_config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningServer(f"http://{host}:{port}/v1", server, thread)
    finally:
        server.should_exit = True
        thread.join(30)
