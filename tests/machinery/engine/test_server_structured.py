"""`course serve` keeps answers to a constraint (chapter 9), with the official `openai` client:
vLLM's `structured_outputs` in `extra_body` and OpenAI's `response_format`. The truth is the
engine driven directly with the same constraint and seed, and outside validators: `re`,
`json.loads` and `jsonschema`. A constraint no backend keeps is a 400 naming its field, before
the engine, and the pool is left with no block held."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest

from solutions.async_engine import AsyncEngine
from solutions.engine import LLMEngine, generate
from solutions.sampling_params import SamplingParams, StructuredOutputsParams
from tests.support import settle
from utils.server import make_engine, running_server
from utils.timing import patient

MODEL = "shakespeare"
pytestmark = pytest.mark.timeout(patient(60))

SCENE = {
    "type": "object",
    "properties": {
        "speaker": {"enum": ["ROMEO", "JULIET", "NURSE"]},
        "act": {"enum": [1, 2, 3, 4, 5]},
        "alive": {"type": "boolean"},
    },
    "required": ["speaker", "act", "alive"],
}


@pytest.fixture(scope="module")
def served(shipped):
    model, tokenizer = shipped
    engine = make_engine(model, tokenizer, max_num_seqs=16, num_blocks=96, keep_finished=True)
    async_engine = AsyncEngine(engine)
    with running_server(async_engine, MODEL) as running:
        yield running, async_engine


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=patient(30))


def engine_text(shipped, so: StructuredOutputsParams, seed: int, max_tokens: int = 40) -> str:
    model, tokenizer = shipped
    out = generate(
        LLMEngine(model, tokenizer),
        ["ROMEO.\n"],
        SamplingParams(max_tokens=max_tokens, seed=seed, structured_outputs=so),
    )[0]
    return tokenizer.decode(out.output_token_ids, skip_special_tokens=True)


CASES = [
    ("regex", {"structured_outputs": {"regex": "[0-9]{3}-(yes|no)"}}),
    ("choice", {"structured_outputs": {"choice": ["Romeo", "Juliet", "Romeo and Juliet"]}}),
    ("json", {"structured_outputs": {"json": SCENE}}),
    ("grammar", {"structured_outputs": {"grammar": 'root ::= "(" root ")" | "x"'}}),
    (
        "response_format json_schema",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "scene", "schema": SCENE, "strict": True},
            }
        },
    ),
]


@pytest.mark.parametrize("name,extra", CASES, ids=[c[0] for c in CASES])
def test_the_server_keeps_each_answer_to_its_constraint_as_the_engine_does(
    served, shipped, name, extra
):
    """Three seeds, streamed and not: the text is the engine's with the same constraint and
    seed, and it keeps the constraint (an outside check)."""
    running, async_engine = served
    api = client(running.url)
    key = next(iter(extra))
    so = (
        StructuredOutputsParams(**extra[key])
        if key == "structured_outputs"
        else StructuredOutputsParams(json=extra[key]["json_schema"]["schema"])
    )
    for seed in range(3):
        kwargs = {"model": MODEL, "prompt": "ROMEO.\n", "max_tokens": 40, "seed": seed}
        answer = api.completions.create(**kwargs, extra_body=extra)
        stream = api.completions.create(**kwargs, extra_body=extra, stream=True)
        text = answer.choices[0].text
        streamed = "".join(c.choices[0].text for c in stream if c.choices)
        assert text == streamed == engine_text(shipped, so, seed), (name, seed, text)
        if answer.choices[0].finish_reason != "stop":
            continue
        if name == "regex":
            assert re.fullmatch("[0-9]{3}-(yes|no)", text)
        elif name == "choice":
            assert text in ("Romeo", "Juliet", "Romeo and Juliet")
        elif name == "grammar":
            assert text == "(" * (len(text) // 2) + "x" + ")" * (len(text) // 2)
        else:
            jsonschema.validate(json.loads(text), SCENE)
    assert settle(async_engine) == []


def test_json_object_gives_an_object_when_it_finishes(served):
    running, _ = served
    api = client(running.url)
    for seed in range(4):
        answer = api.completions.create(
            model=MODEL,
            prompt="ROMEO.\n",
            max_tokens=30,
            seed=seed,
            extra_body={"response_format": {"type": "json_object"}},
        )
        text = answer.choices[0].text
        assert text.startswith("{"), text
        if answer.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)


BAD = [
    # The reason too: the index's parser (interegular) gives its syntax errors no message.
    (
        {"structured_outputs": {"regex": "(ab"}},
        "structured_outputs",
        "cannot compile '(ab': missing )",
    ),
    (
        {"structured_outputs": {"json": {"type": "integer", "exclusiveMinimum": 0}}},
        "structured_outputs",
        "exclusiveMinimum",
    ),
    ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs", "grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    (
        {"structured_outputs": {"whitespace_pattern": " "}},
        "structured_outputs",
        "whitespace_pattern",
    ),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "choice"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format",
        "schema",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": SCENE, "strict": False},
            }
        },
        "response_format",
        "strict",
    ),
    ({"response_format": {"type": "yaml"}}, "response_format", "response_format must be"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "response_format",
        "not both",
    ),
]


def test_a_constraint_no_backend_keeps_is_a_400_that_names_it(served):
    """Before the engine: the pool holds no block after each, and a request beside them is
    served."""
    running, async_engine = served
    with httpx.Client(base_url=running.url, timeout=patient(30)) as http:
        for extra, param, says in BAD:
            body = {"model": MODEL, "prompt": "A", "max_tokens": 4, **extra}
            response = http.post("/completions", json=body)
            assert response.status_code == 400, (extra, response.text)
            error = response.json()["error"]
            assert error["param"] == param and says in error["message"], (extra, error)
        good = http.post("/completions", json={"model": MODEL, "prompt": "A", "max_tokens": 4})
        assert good.status_code == 200
    assert settle(async_engine) == []


def test_many_constrained_streams_at_once_each_keep_theirs(served, shipped):
    """Twelve clients at once, four constraints, each streamed: every text equals the engine's
    for its constraint and seed."""
    running, async_engine = served
    aclient = openai.AsyncOpenAI(
        base_url=running.url, api_key="none", max_retries=0, timeout=patient(30)
    )
    kinds = [CASES[i] for i in (0, 1, 2, 3)] * 3

    async def one(seed, extra):
        stream = await aclient.completions.create(
            model=MODEL, prompt="ROMEO.\n", max_tokens=40, seed=seed, stream=True, extra_body=extra
        )
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_of_them():
        return await asyncio.gather(*(one(s, extra) for s, (_, extra) in enumerate(kinds)))

    texts = asyncio.run(all_of_them())
    for seed, ((_, extra), text) in enumerate(zip(kinds, texts, strict=True)):
        so = StructuredOutputsParams(**extra["structured_outputs"])
        assert text == engine_text(shipped, so, seed), (seed, extra)
    assert settle(async_engine) == []
