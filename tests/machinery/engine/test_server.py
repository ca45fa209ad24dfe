"""`course serve` (utils/server.py, solutions/async_engine.py) with real clients: the official
`openai` client (max_retries=0: no fault hidden by a retry) and raw HTTP (httpx), against a
server started in this process on a free port, on the shipped model.

The truth is the engine driven directly: chapter 8's `generate` on each prompt alone, decoded by
the tokenizer. The server must give the same text, streamed or not, whatever else it serves at
the time; answer every malformed request with its status and the field named, before the engine
and without disturbing it; abort a client that goes away at the next step boundary and leave no
block of it in the pool (tests/support.py's invariants, read in the loop between two
steps); end every request in flight with "abort" at a shutdown. No request may stop the server
or starve the others: malformed bodies (a lone surrogate, NaN, too deep, too big, not JSON's
content type), a step that raises, a full server (429) each get OpenAI's error JSON, and after
each the pool holds no block and a stream beside them keeps its text."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from solutions.async_engine import AsyncEngine
from solutions.engine import LLMEngine, generate
from solutions.sampling_params import SamplingParams
from tests.support import PROMPTS, settle
from utils import REPO_ROOT, cli
from utils import server as server_module
from utils.server import make_engine, running_server
from utils.timing import patient

MODEL = "shakespeare"
pytestmark = pytest.mark.timeout(patient(60))


@pytest.fixture(scope="module")
def served(shipped):
    """One server for the module: a pool of 96 blocks of 16 and 16 seats."""
    model, tokenizer = shipped
    engine = make_engine(model, tokenizer, max_num_seqs=16, num_blocks=96, keep_finished=True)
    async_engine = AsyncEngine(engine)  # its finished requests kept, to be read by the tests
    with running_server(async_engine, MODEL) as running:
        yield running, async_engine


@pytest.fixture(scope="module")
def reference(shipped):
    """What the engine gives on a prompt alone (a fresh engine: nothing else in its batch)."""
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, num_blocks=64, block_size=16)

    def text(prompt, params: SamplingParams) -> tuple[str, str, int]:
        out = generate(engine, [prompt], params)[0]
        return (tokenizer.decode(out.output_token_ids, skip_special_tokens=True),
                out.finish_reason, len(out.output_token_ids))  # fmt: skip

    return text


def client(url: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=patient(30), **kwargs)


def async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=patient(30))


async def stream_text(aclient, **kwargs) -> tuple[str, str, list]:
    """A streamed completion: its text, its finish reason and its chunks."""
    stream = await aclient.completions.create(model=MODEL, stream=True, **kwargs)
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert all(r is None for r in reasons[:-1]), reasons
    return text, reasons[-1], chunks


# --------------------------------------------------------------------------- the same text


def test_greedy_text_is_generates_streamed_and_not(served, reference, shipped):
    running, async_engine = served
    tokenizer = shipped[1]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    want = [reference(p, params) for p in PROMPTS]
    sync = client(running.url)
    for prompt, (text, reason, n) in zip(PROMPTS, want, strict=True):
        answer = sync.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        choice = answer.choices[0]
        assert (choice.text, choice.finish_reason) == (text, reason), prompt
        ids = tokenizer.encode(prompt)
        assert answer.usage.prompt_tokens == len(ids) and answer.usage.completion_tokens == n
        assert answer.object == "text_completion" and answer.model == MODEL

    async def all_at_once():  # every prompt streamed at once, twice, and once more as token ids
        aclient = async_client(running.url)
        calls = [stream_text(aclient, prompt=p, max_tokens=24, temperature=0) for p in PROMPTS]
        calls += [stream_text(aclient, prompt=p, max_tokens=24, temperature=0) for p in PROMPTS]
        calls += [stream_text(aclient, prompt=tokenizer.encode(p), max_tokens=24, temperature=0)
                  for p in PROMPTS]  # fmt: skip
        return await asyncio.gather(*calls)

    got = asyncio.run(all_at_once())
    for i, (text, reason, _) in enumerate(got):
        assert (text, reason) == want[i % len(PROMPTS)][:2], PROMPTS[i % len(PROMPTS)]
    assert settle(async_engine) == []


def test_the_stream_is_openais_server_sent_events_with_usage(served, reference):
    running, _ = served
    text, _, n = reference(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=12))
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", running.url + "/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    *text_chunks, usage_chunk = chunks
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == text
    assert all(c["usage"] is None for c in text_chunks)
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == n
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len({c["id"] for c in chunks}) == 1


def test_seeded_samples_repeat_alone_and_among_others(served, reference):
    running, async_engine = served
    asked = {"prompt": PROMPTS[2], "max_tokens": 20, "temperature": 0.9, "top_p": 0.95, "seed": 7}
    want, _, _ = reference(
        PROMPTS[2], SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=7)
    )
    sync = client(running.url)
    alone = [sync.completions.create(model=MODEL, **asked).choices[0].text for _ in range(2)]
    assert alone == [want, want], "the same seed must give the same text (and generate's)"
    kasked = {**asked, "top_p": None, "seed": 3, "extra_body": {"top_k": 40}}  # vLLM's field
    kwant, _, _ = reference(PROMPTS[2], SamplingParams(temperature=0.9, top_k=40, max_tokens=20,
                                                        seed=3))  # fmt: skip

    async def among_others():
        aclient = async_client(running.url)
        others = [  # unseeded and other seeds, some greedy, longer and shorter
            aclient.completions.create(model=MODEL, prompt=p, max_tokens=10 + 7 * i,
                                       temperature=1.0 if i % 2 else 0.0,
                                       seed=None if i % 3 else 100 + i)
            for i, p in enumerate(PROMPTS)
        ]  # fmt: skip
        mine = [stream_text(aclient, **asked), aclient.completions.create(model=MODEL, **asked),
                aclient.completions.create(model=MODEL, **kasked)]  # fmt: skip
        results = await asyncio.gather(*mine, *others)
        return results[0][0], results[1].choices[0].text, results[2].choices[0].text

    streamed, plain, top_k = asyncio.run(among_others())
    assert streamed == want and plain == want, "a seeded request's text must not depend on others"
    assert top_k == kwant
    assert settle(async_engine) == []


def test_stop_strings_end_the_text_and_nothing_past_them_is_sent(served, reference):
    running, async_engine = served
    full, _, _ = reference(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=60))
    # A stop string of several tokens that begins inside the text's third word, a one-character
    # one, and one that never comes; the earliest in the text wins.
    words = full.split(" ")
    multi = " " + " ".join(words[3:5])
    assert full.find(multi) > 0
    for stop in ([multi], ["\n"], [multi, "\n"], ["never in this text"]):
        hits = [full.find(s) for s in stop if s in full]
        want = full[: min(hits)] if hits else full
        want_reason = "stop" if hits else "length"
        asked = {"prompt": PROMPTS[0], "max_tokens": 60, "temperature": 0, "stop": stop}
        answer = client(running.url).completions.create(model=MODEL, **asked)
        assert (answer.choices[0].text, answer.choices[0].finish_reason) == (want, want_reason)
        text, reason, chunks = asyncio.run(stream_text(async_client(running.url), **asked))
        assert (text, reason) == (want, want_reason), stop
        assert all(not any(s in c.choices[0].text for s in stop) for c in chunks if c.choices)
    assert settle(async_engine) == []


# ------------------------------------------------------------------------------ bad requests

GOOD = {"model": MODEL, "prompt": "ROMEO.\n", "max_tokens": 4, "temperature": 0}
JSON = {"content-type": "application/json"}
LONG_TEXT = "ROMEO. " * 2_500  # 17,500 bytes: at least 302 tokens, more than n_ctx=256
BAD = [  # (body, status, the field named; None: the body as a whole)
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"prompt": "x", "temperature": NaN}', 400, None),  # Python's parser takes NaN: not JSON
    (b'{"prompt": "x", "max_tokens": Infinity}', 400, None),
    (b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", 400, None),  # over 4,300 digits
    (b"[" * 100_000, 400, None),  # too deep for the parser
    (b"\xff\xfe{}", 400, None),  # not UTF-8
    (b'{"prompt": "\\ud800 lone"}', 400, "prompt"),  # a lone surrogate (UTF-8 cannot write it)
    (b'{"prompt": "x", "stop": ["\\udfff"]}', 400, "stop"),
    (b'{"prompt": "x", "model": "\\ud800"}', 404, "model"),  # quoted back in the message
    ({**GOOD, "prompt": LONG_TEXT}, 400, "prompt"),  # refused before it is tokenized
    ({**GOOD, "prompt": [[45, 4096]]}, 400, "prompt"),
    ({**GOOD, "prompt": [[[45]]]}, 400, "prompt"),
    ({**GOOD, "prompt": [45] * 100_000}, 400, "prompt"),
    ({**GOOD, "max_tokens": -5}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": 10**30}, 400, "max_tokens"),
    ({**GOOD, "n": 10**30}, 400, "n"),
    ({**GOOD, "logprobs": 99}, 400, "logprobs"),
    ({**GOOD, "logprobs": -1}, 400, "logprobs"),
    ({**GOOD, "top_k": 4097}, 400, "top_k"),
    ({**GOOD, "temperature": 2.5}, 400, "temperature"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({**GOOD, "stop": "x" * 257}, 400, "stop"),
    ({"model": MODEL}, 400, "prompt"),
    ({**GOOD, "prompt": 5}, 400, "prompt"),
    ({**GOOD, "prompt": ""}, 400, "prompt"),
    ({**GOOD, "prompt": []}, 400, "prompt"),
    ({**GOOD, "prompt": ["ROMEO.", "JULIET."]}, 400, "prompt"),
    ({**GOOD, "prompt": [45, -1]}, 400, "prompt"),
    ({**GOOD, "prompt": [45, 4096]}, 400, "prompt"),
    ({**GOOD, "prompt": [45, "a"]}, 400, "prompt"),
    ({**GOOD, "prompt": [45] * 257}, 400, "prompt"),
    ({**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": "5"}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": 2.5}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": True}, 400, "max_tokens"),
    ({**GOOD, "prompt": [45] * 200, "max_tokens": 58}, 400, "max_tokens"),  # 257 positions
    ({**GOOD, "temperature": -0.5}, 400, "temperature"),
    ({**GOOD, "temperature": "hot"}, 400, "temperature"),
    ({**GOOD, "top_p": 0}, 400, "top_p"),
    ({**GOOD, "top_p": 1.5}, 400, "top_p"),
    ({**GOOD, "top_k": -2}, 400, "top_k"),
    ({**GOOD, "top_k": 5, "top_p": 0.5}, 400, "top_k"),
    ({**GOOD, "seed": -1}, 400, "seed"),
    ({**GOOD, "seed": "7"}, 400, "seed"),
    ({**GOOD, "stop": 3}, 400, "stop"),
    ({**GOOD, "stop": ["", "x"]}, 400, "stop"),
    ({**GOOD, "stream": "yes"}, 400, "stream"),
    ({**GOOD, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({**GOOD, "stream": True, "stream_options": {"include_usage": 1}}, 400, "stream_options"),
    ({**GOOD, "ignore_eos": 1}, 400, "ignore_eos"),
    ({**GOOD, "frequency_penalty": 0.5}, 400, "frequency_penalty"),
    ({**GOOD, "presence_penalty": 0.5}, 400, "presence_penalty"),
    ({**GOOD, "n": 2}, 400, "n"),
    ({**GOOD, "best_of": 2}, 400, "best_of"),
    ({**GOOD, "echo": True}, 400, "echo"),
    ({**GOOD, "logprobs": 1}, 400, "logprobs"),
    ({**GOOD, "logit_bias": {"45": 10}}, 400, "logit_bias"),
    ({**GOOD, "suffix": "x"}, 400, "suffix"),
    ({**GOOD, "bogus": 1}, 400, "bogus"),
    ({**GOOD, "model": 3}, 400, "model"),
    ({**GOOD, "model": "gpt-4"}, 404, "model"),
]

BAD_PATHS = [("GET", "/nowhere", 404), ("GET", "/completions", 405)]
BAD_TYPES = [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx"]
ACCEPTED = [  # neutral values and vLLM's "off" for top_k: the same greedy text as GOOD's
    {**GOOD, "temperature": 1e-40},  # below vLLM's 1e-5: greedy (it once killed the engine)
    {**GOOD, "temperature": 5e-324, "seed": 3},
    {**GOOD, "temperature": 9.9e-6, "top_k": 4096},
    {**GOOD, "stop": ["a" * 256, "\x00", "@@", "##"]},
    {**GOOD, "top_k": -1},
    {**GOOD, "top_k": 0, "top_p": 1},
    {**GOOD, "prompt": ["ROMEO.\n"]},
    {**GOOD, "n": 1, "frequency_penalty": 0, "presence_penalty": 0.0, "echo": False,
     "logprobs": None, "best_of": 1, "logit_bias": {}, "suffix": None, "user": "me"},
]  # fmt: skip


def test_bad_requests_are_answered_with_openais_error_and_disturb_nothing(served, reference):
    running, async_engine = served
    want_long, _, _ = reference(PROMPTS[4], SamplingParams(temperature=0.0, max_tokens=80))
    want_short, _, _ = reference("ROMEO.\n", SamplingParams(temperature=0.0, max_tokens=4))
    url = running.url + "/completions"

    async def run():
        aclient = async_client(running.url)
        # A long stream runs while every bad request is answered: none may disturb it.
        long = asyncio.ensure_future(
            stream_text(aclient, prompt=PROMPTS[4], max_tokens=80, temperature=0)
        )
        answers = []
        async with httpx.AsyncClient(timeout=30) as http:
            for body, _, _ in BAD:
                sent = {"content": body} if isinstance(body, bytes) else {"json": body}
                answers.append(await http.post(url, headers=JSON, **sent))
                good = await http.post(url, json=GOOD)  # and the next request is served right
                assert good.status_code == 200 and good.json()["choices"][0]["text"] == want_short
            for body in ACCEPTED:
                good = await http.post(url, json=body)
                assert good.status_code == 200, (body, good.text)
                assert good.json()["choices"][0]["text"] == want_short, body
            for method, path, _ in BAD_PATHS:
                answers.append(await http.request(method, running.url + path))
            for kind in BAD_TYPES:
                typed = await http.post(url, content=json.dumps(GOOD).encode(),
                                        headers={"content-type": kind} if kind else {})  # fmt: skip
                assert typed.status_code == 415, (kind, typed.text)
                assert typed.json()["error"]["code"] == "unsupported_media_type"
            charset = {"content-type": "application/json; charset=utf-8"}
            typed = await http.post(url, content=json.dumps(GOOD).encode(), headers=charset)
            assert typed.status_code == 200 and typed.json()["choices"][0]["text"] == want_short
            chat = await http.post(running.url + "/chat/completions", json=GOOD)
            big = await http.post(url, content=b" " * 2_000_001, headers=JSON)
        return answers, await long, chat, big

    answers, (long_text, _, _), chat, big = asyncio.run(run())
    for (body, status, param), answer in zip(BAD, answers, strict=False):
        assert answer.status_code == status, (body[:60], answer.text)
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, answer.text
        assert error["param"] == param and (param is None or param in error["message"]), error
        assert len(error["message"]) < 400, "a message quotes the client's value, cut short"
    for (_, path, status), answer in zip(BAD_PATHS, answers[len(BAD) :], strict=True):
        assert answer.status_code == status and "message" in answer.json()["error"], path
    assert "POST /v1/completions" in answers[len(BAD)].json()["error"]["message"]
    assert chat.status_code == 404 and "POST /v1/completions" in chat.json()["error"]["message"]
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    assert long_text == want_long, "a bad request disturbed a request in flight"
    with pytest.raises(openai.NotFoundError, match="only, POST /v1/completions"):
        client(running.url).chat.completions.create(model=MODEL, messages=[])
    # The official client raises them as their status's errors.
    with pytest.raises(openai.BadRequestError) as raised:
        client(running.url).completions.create(model=MODEL, prompt="ROMEO.", max_tokens=0)
    assert raised.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client(running.url).completions.create(model="gpt-4", prompt="ROMEO.")
    assert settle(async_engine) == []
    health = httpx.get(running.url.removesuffix("/v1") + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok", health.text
    idle = health.json()["engine"]  # nothing runs: every block is free
    assert idle["running"] == idle["waiting"] == idle["blocks_in_use"] == 0, idle
    assert idle["blocks_free"] == async_engine.engine.num_blocks, idle


def test_models_health_and_the_api_key(shipped):
    model, tokenizer = shipped
    async_engine = AsyncEngine(make_engine(model, tokenizer, max_num_seqs=2, num_blocks=32))
    with running_server(async_engine, MODEL, api_key="s3cret") as running:
        base = running.url.removesuffix("/v1")
        assert httpx.get(base + "/health").status_code == 200  # no key needed
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            answer = httpx.get(running.url + "/models", headers=headers)
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
            answer = httpx.post(running.url + "/completions", json=GOOD, headers=headers)
            assert answer.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=running.url, api_key="wrong", max_retries=0).models.list()
        keyed = openai.OpenAI(base_url=running.url, api_key="s3cret", max_retries=0)
        assert [m.id for m in keyed.models.list().data] == [MODEL]
        assert keyed.completions.create(**GOOD).choices[0].finish_reason == "length"
        assert running.url.startswith("http://127.0.0.1:")


def test_special_token_names_in_a_prompt_are_text(served, reference, shipped):
    """ "<|endoftext|>" typed in a prompt is 13 characters, never the end-of-text token (id 0):
    no client can forge one in the middle of its prompt. A prompt of token ids may hold id 0."""
    running, async_engine = served
    tokenizer = shipped[1]
    text = "ROMEO.<|endoftext|>\n"
    as_text = tokenizer.encode(text, split_special_tokens=True)
    assert 0 not in as_text and 0 in tokenizer.encode(text)
    params = SamplingParams(temperature=0.0, max_tokens=8)
    sync = client(running.url)
    answer = sync.completions.create(model=MODEL, prompt=text, max_tokens=8, temperature=0)
    assert answer.usage.prompt_tokens == len(as_text)
    assert answer.choices[0].text == reference(as_text, params)[0]
    ids = [*tokenizer.encode("ROMEO."), 0, *tokenizer.encode("\n")]
    answer = sync.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.choices[0].text == reference(ids, params)[0]
    assert settle(async_engine) == []


@pytest.fixture(scope="module")
def one_seat(shipped):
    """A server of one seat (a second request waits) and at most 2 requests in flight."""
    model, tokenizer = shipped
    engine = make_engine(model, tokenizer, max_num_seqs=1, num_blocks=48)
    async_engine = AsyncEngine(engine)
    with running_server(async_engine, MODEL, max_concurrent_requests=2) as running:
        yield running, async_engine


def test_a_full_server_answers_429_and_its_health_says_so(one_seat):
    running, async_engine = one_seat
    base = running.url.removesuffix("/v1")
    long = {**GOOD, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=patient(30)) as http:
        with http.stream("POST", running.url + "/completions", json=long) as first:
            with http.stream("POST", running.url + "/completions", json=long) as second:
                assert first.status_code == second.status_code == 200
                full = http.post(running.url + "/completions", json=GOOD)
                assert full.status_code == 429 and full.headers["retry-after"] == "1"
                error = full.json()["error"]
                assert error["code"] == "server_saturated" and "max_concurrent" in error["message"]
                health = http.get(base + "/health")
                assert health.status_code == 503, health.text
                body = health.json()
                report = body.pop("engine")  # the engine's report: both run or wait
                assert report["running"] + report["waiting"] == 2, report
                assert report["blocks_in_use"] > 0 and report["blocks_free"] >= 0, report
                assert body == {"status": "saturated", "requests": 2,
                                "max_concurrent_requests": 2}  # fmt: skip
                with pytest.raises(openai.RateLimitError):
                    client(running.url).completions.create(**GOOD)
        deadline = time.monotonic() + patient(10)  # both went away: their seats free up
        while http.get(base + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the server stays saturated"
            time.sleep(0.02)
        assert http.post(running.url + "/completions", json=GOOD).status_code == 200
    assert settle(async_engine) == []


def test_a_step_that_raises_ends_its_requests_and_the_engine_goes_on(
    one_seat, reference, monkeypatch, caplog
):
    """A fault in the forward pass (injected while a poisoned prompt runs and another waits):
    the poisoned request ends with OpenAI's error JSON (a 500, or an error event in its stream),
    the traceback is in the log, the waiting request is served its own text, and so is every
    later one; /health stays 200 and the pool holds no block."""
    running, async_engine = one_seat
    engine = async_engine.engine
    poison = [7, 7, 7, 7, 7]
    forward = engine.runner.forward

    def faulty(*args, **kwargs):
        if engine.scheduler.waiting and any(r.prompt_token_ids == poison
                                            for r in engine.scheduler.running):  # fmt: skip
            raise RuntimeError("an injected fault")
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "forward", faulty)
    want, _, _ = reference("ROMEO.\n", SamplingParams(temperature=0.0, max_tokens=4))
    url = running.url + "/completions"

    async def poisoned_then_another(stream: bool):
        async with httpx.AsyncClient(timeout=patient(30)) as http:
            body = {**GOOD, "prompt": poison, "max_tokens": 200, "ignore_eos": True,
                    "stream": stream}  # fmt: skip
            first = asyncio.ensure_future(http.post(url, json=body))
            while not await asyncio.wrap_future(
                async_engine.call(
                    lambda e: any(r.prompt_token_ids == poison for r in e.scheduler.running)
                )
            ):
                await asyncio.sleep(0.005)  # fmt: skip
            second = await http.post(url, json=GOOD)  # waits for the seat, then the fault
            return await first, second

    with caplog.at_level("ERROR", logger="solutions.async_engine"):
        for stream in (False, True):
            first, second = asyncio.run(poisoned_then_another(stream))
            assert second.status_code == 200 and second.json()["choices"][0]["text"] == want
            if stream:
                events = [e for e in first.text.split("\n") if e.startswith("data: ")]
                assert events[-1] == "data: [DONE]"
                error = json.loads(events[-2][len("data: ") :])["error"]
            else:
                assert first.status_code == 500, first.text
                error = first.json()["error"]
            assert error["code"] == "engine_error" and "an injected fault" in error["message"]
    assert "Traceback" in caplog.text and "RuntimeError: an injected fault" in caplog.text
    assert httpx.get(running.url.removesuffix("/v1") + "/health").status_code == 200
    answer = client(running.url).completions.create(**GOOD)
    assert answer.choices[0].text == want
    assert settle(async_engine) == []


def test_course_serve_reads_its_key_from_the_environment_and_runs_one_thread(monkeypatch):
    """`ps` shows a command line to every user of the machine: the key may come from
    COURSE_API_KEY instead (vLLM's VLLM_API_KEY). The flag wins; PyTorch gets one thread unless
    --threads says otherwise."""
    calls = []
    monkeypatch.setattr(server_module, "serve", lambda *a, **k: calls.append(k))
    monkeypatch.setenv("COURSE_API_KEY", "from-env")
    cli.main(["serve"])
    cli.main(["serve", "--api-key", "from-flag", "--threads", "2"])
    monkeypatch.setenv("COURSE_API_KEY", "")
    cli.main(["serve", "--max-concurrent-requests", "8"])
    assert [(c["api_key"], c["threads"], c["max_concurrent_requests"]) for c in calls] == [
        ("from-env", 1, 128), ("from-flag", 2, 128), (None, 1, 8)
    ]  # fmt: skip


# ------------------------------------------------------------------------------- disconnects


def test_clients_that_go_away_are_aborted_and_leave_no_block(served, reference, shipped):
    running, async_engine = served
    rng = random.Random(0)
    keep = [reference(p, SamplingParams(temperature=0.0, max_tokens=40)) for p in PROMPTS[:3]]
    url = running.url + "/completions"
    before = async_engine.call(lambda e: set(e.requests)).result(10)

    async def leaver(i: int) -> str | None:
        """A stream closed after a random number of events (0: before the first one)."""
        body = {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 120,
                "temperature": 1.0, "ignore_eos": True, "stream": True}  # fmt: skip
        request_id = None
        async with httpx.AsyncClient(timeout=30) as http:
            async with http.stream("POST", url, json=body) as response:
                leave_after = rng.randint(0, 30)
                seen = 0
                async for line in response.aiter_lines():
                    if seen >= leave_after:
                        break
                    if line.startswith("data: {"):
                        request_id = json.loads(line[len("data: ") :])["id"]
                        seen += 1
        return request_id

    async def impatient() -> None:
        """A non-streamed request whose client gives up before the answer."""
        body = {**GOOD, "max_tokens": 200, "ignore_eos": True, "prompt": PROMPTS[1]}
        with pytest.raises(httpx.ReadTimeout):
            async with httpx.AsyncClient(timeout=0.3) as http:
                await http.post(url, json=body)

    async def run():
        aclient = async_client(running.url)
        keepers = [stream_text(aclient, prompt=p, max_tokens=40, temperature=0)
                   for p in PROMPTS[:3]]  # fmt: skip
        results = await asyncio.gather(*keepers, *(leaver(i) for i in range(10)), impatient())
        return results[:3], results[3:13]

    kept, left = asyncio.run(run())
    for (text, reason, _), (want, want_reason, _) in zip(kept, keep, strict=True):
        assert (text, reason) == (want, want_reason), "a disconnect changed another stream's text"
    assert settle(async_engine) == []

    def ends(engine):
        return {rid: r.finish_reason for rid, r in engine.requests.items() if rid not in before}

    reasons = async_engine.call(ends).result(10)
    assert sorted(reasons.values()).count("abort") == 11, reasons  # 10 streams, 1 impatient
    assert all(reasons[rid] == "abort" for rid in left if rid is not None)


# ---------------------------------------------------------------------------------- shutdown


def test_a_shutdown_ends_every_request_in_flight_with_abort(shipped):
    model, tokenizer = shipped
    async_engine = AsyncEngine(make_engine(model, tokenizer, max_num_seqs=8, num_blocks=64))
    with running_server(async_engine, MODEL) as running:

        async def run():
            aclient = async_client(running.url)
            asked = {"max_tokens": 200, "temperature": 0.8, "extra_body": {"ignore_eos": True}}
            streams = [await aclient.completions.create(model=MODEL, prompt=p, stream=True,
                                                        **asked) for p in PROMPTS[:3]]  # fmt: skip
            firsts = [await anext(aiter(s)) for s in streams]  # each has begun
            whole = asyncio.ensure_future(
                aclient.completions.create(model=MODEL, prompt=PROMPTS[3], **asked)
            )
            await asyncio.sleep(0.05)
            running.server.handle_exit(signal.SIGTERM, None)  # what the signal calls
            rests = [[c async for c in s] for s in streams]
            return firsts, rests, await whole

        firsts, rests, whole = asyncio.run(run())
        for rest in rests:
            assert rest[-1].choices[0].finish_reason == "abort"
            assert all(c.choices[0].finish_reason is None for c in rest[:-1])
        assert whole.choices[0].finish_reason == "abort"
        assert whole.usage.completion_tokens < 200
        running.thread.join(patient(20))
        assert not running.thread.is_alive(), "the server did not exit"
    assert not async_engine.running


def test_course_serve_starts_on_localhost_and_stops_at_sigint():
    """The command itself, in a process of its own: it serves the shipped model on 127.0.0.1,
    and Ctrl+C (SIGINT) ends a request in flight with "abort" and exits cleanly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "utils.cli", "serve", "--port", str(port)]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + patient(60)
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "course serve did not start"
            time.sleep(0.2)
        body = {**GOOD, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            process.send_signal(signal.SIGINT)
            events = [first] + [line for line in lines if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][len("data: ") :])["choices"][0]["finish_reason"] == "abort"
        assert process.wait(patient(30)) == 0
        assert f"serving {MODEL} on http://127.0.0.1:{port}/v1" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_long_running_server_keeps_no_finished_request(shipped):
    model, tokenizer = shipped
    async_engine = AsyncEngine(make_engine(model, tokenizer, max_num_seqs=4, num_blocks=32))
    with running_server(async_engine, MODEL) as running:
        client = openai.OpenAI(base_url=running.url, api_key="none", max_retries=0)
        for prompt in PROMPTS[:3]:
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, stop=["e"])
        left = async_engine.call(lambda e: (dict(e.requests), e.has_unfinished_requests()))
        assert left.result(10) == ({}, False), "the engine keeps requests it has finished"
