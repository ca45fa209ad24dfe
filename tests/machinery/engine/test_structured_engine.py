"""Chapter 9's constraints in chapter 8's engine (solutions/structured_outputs.py), checked from
outside: every finished answer `re.fullmatch`es its regex or parses and validates with
`jsonschema`; the index backend's masks equal xgrammar's along sampled paths; the bitmask
functions equal xgrammar's layout and its `apply_token_bitmask_inplace`; neighbours' tokens,
seeded draws, preemption and the prefix cache are unchanged by a constraint; a constraint no
backend keeps is refused by name, the other requests served."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import torch

from solutions.engine import LLMEngine, generate
from solutions.sampling_params import SamplingParams, StructuredOutputsParams
from solutions.token_bitmask import apply_token_bitmask, bitmask_of, bitmask_width
from tests.support import check_invariants
from tests.support import run_to_end as run_steps
from utils.models import load_model

xgr = pytest.importorskip("xgrammar")

SCENE = {
    "type": "object",
    "properties": {
        "speaker": {"enum": ["ROMEO", "JULIET", "NURSE"]},
        "act": {"type": "integer"},
        "lines": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["speaker", "act", "lines"],
}
TREE = {  # nests without a bound: xgrammar's
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "name": {"enum": ["a", "b"]},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
            },
            "required": ["name", "kids"],
        }
    },
    "$ref": "#/$defs/node",
}
PARENS = 'root ::= "(" root ")" | "x"'
CONSTRAINTS = {
    "regex": StructuredOutputsParams(regex="[0-9]{3}-(yes|no)"),
    "choice": StructuredOutputsParams(choice=["Romeo", "Juliet", "Romeo and Juliet"]),
    "json": StructuredOutputsParams(json=SCENE),
    "json nested": StructuredOutputsParams(json=TREE),
    "grammar": StructuredOutputsParams(grammar=PARENS),
    "json_object": StructuredOutputsParams(json_object=True),
}


@pytest.fixture(scope="module")
def shipped():
    return load_model("shakespeare")


def keeps(name: str, text: str) -> bool:
    """Whether `text` keeps the constraint `name` (outside oracles: re, json, jsonschema)."""
    if name == "regex":
        return re.fullmatch("[0-9]{3}-(yes|no)", text) is not None
    if name == "choice":
        return text in CONSTRAINTS["choice"].choice
    if name == "grammar":
        depth = len(text) // 2
        return text == "(" * depth + "x" + ")" * depth
    try:
        value = json.loads(text)
    except ValueError:
        return False
    schema = {"json": SCENE, "json nested": TREE, "json_object": {"type": "object"}}[name]
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def text_of(tokenizer, output) -> str:
    return tokenizer.decode(output.output_token_ids, skip_special_tokens=True)


def run_to_end(engine: LLMEngine) -> dict:
    return run_steps(engine, 5000, check=check_invariants)


def test_every_finished_answer_keeps_its_constraint_among_unconstrained_neighbours(shipped):
    """Each kind of constraint, three seeds each, in one batch with unconstrained requests:
    every answer that stopped at end-of-text keeps its constraint, and the unconstrained
    requests' tokens are the ones they draw with no constrained neighbour."""
    model, tokenizer = shipped
    names = list(CONSTRAINTS) * 3
    constrained = [
        SamplingParams(max_tokens=48, seed=i, structured_outputs=CONSTRAINTS[n])
        for i, n in enumerate(names)
    ]
    free = [SamplingParams(max_tokens=24, seed=100 + i) for i in range(3)]
    prompts = ["ROMEO.\n"] * len(names) + ["JULIET.\n"] * 3
    crowd = generate(LLMEngine(model, tokenizer, num_blocks=256), prompts, constrained + free)
    stopped = 0
    for name, output in zip(names, crowd, strict=False):
        assert output.error is None, output.error
        if output.finish_reason == "stop":
            stopped += 1
            assert keeps(name, text_of(tokenizer, output)), (name, text_of(tokenizer, output))
    assert stopped >= len(names) // 2  # most finish within 48 tokens (json_object need not)
    alone = generate(LLMEngine(model, tokenizer, num_blocks=256), prompts[-3:], free)
    assert [o.output_token_ids for o in crowd[-3:]] == [o.output_token_ids for o in alone]


def test_a_seeded_constrained_request_draws_the_same_alone_and_in_a_crowd(shipped):
    model, tokenizer = shipped
    params = SamplingParams(max_tokens=40, seed=7, structured_outputs=CONSTRAINTS["json"])
    alone = generate(LLMEngine(model, tokenizer), ["NURSE.\n"], params)[0]
    crowd_params = [SamplingParams(max_tokens=30, seed=i) for i in range(5)] + [params]
    crowd = generate(LLMEngine(model, tokenizer, num_blocks=128), ["A"] * 5 + ["NURSE.\n"],
                     crowd_params)[-1]  # fmt: skip
    assert crowd.output_token_ids == alone.output_token_ids


def test_preemption_and_the_prefix_cache_leave_the_constraint_state_right(shipped):
    """A pool so small that requests are preempted and recomputed, and a shared prompt found
    in the prefix cache: the tokens equal a run with a large pool and no prefix cache, and
    every finished answer keeps its constraint."""
    model, tokenizer = shipped
    prompt = "ROMEO.\nWhat say you, my lord? Speak, and tell me all that you have seen.\n"
    names = ["json", "regex", "json nested", "choice"] * 2
    params = [SamplingParams(max_tokens=40, seed=i, structured_outputs=CONSTRAINTS[n])
              for i, n in enumerate(names)]  # fmt: skip
    roomy = LLMEngine(model, tokenizer, num_blocks=256, enable_prefix_caching=False)
    tight = LLMEngine(model, tokenizer, num_blocks=12, block_size=8)
    for engine in (roomy, tight):
        for i, p in enumerate(params):
            engine.add_request(f"r{i}", prompt, p)
    want, got = run_to_end(roomy), run_to_end(tight)
    assert tight.stats.preemptions > 0 and tight.stats.prompt_tokens_cached > 0
    for i, name in enumerate(names):
        assert got[f"r{i}"] == want[f"r{i}"], name
    for i, name in enumerate(names):
        request = tight.requests[f"r{i}"]
        if request.finish_reason == "stop":
            assert keeps(name, tokenizer.decode(request.output_token_ids,
                                                skip_special_tokens=True))  # fmt: skip


@pytest.mark.parametrize("schema", [SCENE, {"type": "array", "items": {"type": "string"}}],
                         ids=["scene", "strings"])  # fmt: skip
def test_the_index_masks_equal_xgrammars_along_sampled_paths(shipped, schema):
    """The index backend's bitmask rows and xgrammar's (given the same regex, `compile_regex`)
    at every step of answers the index backend draws. xgrammar also lets a character begin
    with the bytes ED A0-BF (a surrogate, invalid UTF-8); its one single-byte token `\\xed` is
    left out of the comparison."""
    model, tokenizer = shipped
    index_engine = LLMEngine(model, tokenizer, num_blocks=128, structured_outputs_backend="index")
    x_engine = LLMEngine(model, tokenizer, structured_outputs_backend="xgrammar")
    from solutions.json_schema import schema_to_regex

    regex = StructuredOutputsParams(regex=schema_to_regex(schema))
    index_grammar, x_grammar = (
        index_engine.structured.compile(regex),
        x_engine.structured.compile(regex),
    )
    vocab = index_engine.structured.vocab
    lenient = [i for i, b in enumerate(vocab) if b == b"\xed"]
    outputs = generate(
        index_engine, ["ROMEO.\n"] * 6,
        [SamplingParams(max_tokens=40, seed=s, structured_outputs=regex) for s in range(6)],
    )  # fmt: skip
    width = bitmask_width(model.cfg.d_vocab)
    steps = 0
    for output in outputs:
        ours, theirs = index_grammar.matcher(), x_grammar.matcher()
        for token in output.output_token_ids:
            rows = torch.full((2, width), -1, dtype=torch.int32)
            ours.fill(rows, 0)
            theirs.fill(rows, 1)
            a, b = (set(np.flatnonzero(unpack(r, model.cfg.d_vocab))) - set(lenient) for r in rows)
            assert a == b, (steps, sorted(a ^ b)[:10])
            assert ours.accept(token) and theirs.accept(token)
            steps += 1
    assert steps > 50


def unpack(row: torch.Tensor, d_vocab: int) -> np.ndarray:
    """xgrammar's layout read by numpy: bit k of word w is token 32w + k, least significant
    bit first."""
    return np.unpackbits(row.numpy().view(np.uint8), bitorder="little")[:d_vocab]


@pytest.mark.parametrize("d_vocab", [4096, 50, 4100])
def test_bitmask_rows_are_xgrammars_layout_and_apply_as_xgrammar_does(d_vocab):
    generator = torch.Generator().manual_seed(0)
    for allowed in [[0], [31], [32, d_vocab - 1], list(range(0, d_vocab, 3)), [], None]:
        if allowed is None:
            allowed = torch.randperm(d_vocab, generator=generator)[: d_vocab // 2].tolist()
        row = bitmask_of(allowed, d_vocab)
        assert row.dtype == torch.int32 and row.shape == (bitmask_width(d_vocab),)
        assert np.flatnonzero(unpack(row, d_vocab)).tolist() == sorted(allowed)
        assert tuple(xgr.allocate_token_bitmask(1, d_vocab).shape) == (1, len(row))
    rows = torch.randint(-(2**31), 2**31 - 1, (5, bitmask_width(d_vocab)), dtype=torch.int32,
                         generator=generator)  # fmt: skip
    rows[0] = -1
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(5, d_vocab, generator=generator).to(dtype)
        theirs = logits.clone()
        xgr.apply_token_bitmask_inplace(theirs, rows)
        assert torch.equal(apply_token_bitmask(logits, rows), theirs)


def test_a_constraint_no_backend_keeps_is_refused_by_name_and_the_others_served(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer)
    bad = {
        "minimum-free": StructuredOutputsParams(json={"type": "integer", "exclusiveMinimum": 0}),
        "bad regex": StructuredOutputsParams(regex="(ab"),
        "bad grammar": StructuredOutputsParams(grammar="root ::= "),
    }
    for i, so in enumerate(bad.values()):
        engine.add_request(f"bad{i}", "A", SamplingParams(max_tokens=4, structured_outputs=so))
    engine.add_request("good", "A", SamplingParams(max_tokens=4, seed=0))
    run_to_end(engine)
    errors = [engine.requests[f"bad{i}"].error for i in range(len(bad))]
    assert "exclusiveMinimum" in errors[0]
    assert "regex" in errors[1] and "grammar" in errors[2]
    assert engine.requests["good"].finish_reason == "length"
    index_only = LLMEngine(model, tokenizer, structured_outputs_backend="index")
    with pytest.raises(ValueError, match="xgrammar"):
        index_only.structured.compile(CONSTRAINTS["grammar"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])


def test_a_constraint_is_compiled_once_and_the_cache_is_bounded(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer)
    manager = engine.structured
    manager.cache_size = 3
    first = manager.compile(StructuredOutputsParams(json=SCENE))
    assert manager.compile(StructuredOutputsParams(json=json.dumps(SCENE))) is first
    reordered = dict(SCENE, properties=dict(reversed(SCENE["properties"].items())))
    assert manager.compile(StructuredOutputsParams(json=reordered)) is not first  # key order
    for n in range(5):
        manager.compile(StructuredOutputsParams(regex=f"[a-z]{{{n}}}"))
    assert len(manager.cache) == 3


XGRAMMAR_SCHEMAS = {
    "anyOf": {"anyOf": [{"type": "integer"}, {"enum": ["none"]}]},
    "minimum maximum": {"type": "integer", "minimum": 3, "maximum": 12},
    "minLength maxLength": {"type": "string", "minLength": 2, "maxLength": 4},
    "optional properties": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2]}},
        "required": ["a"],
    },
    "items absent": {"type": "array", "maxItems": 2},
}


@pytest.mark.parametrize("name", list(XGRAMMAR_SCHEMAS))
def test_each_keyword_sent_to_xgrammar_is_kept(shipped, name):
    """Every keyword `XGRAMMAR_KEYWORDS` adds to the index's subset, in a schema of its own:
    each of 12 seeded answers that finishes validates with `jsonschema`."""
    model, tokenizer = shipped
    schema = XGRAMMAR_SCHEMAS[name]
    so = StructuredOutputsParams(json=schema)
    params = [SamplingParams(max_tokens=30, seed=s, structured_outputs=so) for s in range(12)]
    outputs = generate(LLMEngine(model, tokenizer, num_blocks=128), ["ROMEO.\n"] * 12, params)
    finished = [text_of(tokenizer, o) for o in outputs if o.finish_reason == "stop"]
    assert finished, f"{name}: no answer finished within 30 tokens"
    validator = jsonschema.Draft202012Validator(schema)
    for text in finished:
        assert validator.is_valid(json.loads(text)), (name, text)


def test_a_free_object_takes_exactly_the_compact_json_objects(shipped):
    """`json_object` (any object, nested as deeply as it likes; no regex says it): texts
    tokenized as the tokenizer writes them, fed token by token to a matcher, then
    end-of-text; kept exactly when `json.loads` gives an object (compact texts only)."""
    model, tokenizer = shipped
    grammar = LLMEngine(model, tokenizer).structured.compile(CONSTRAINTS["json_object"])
    texts = [
        "{}",
        '{"a":{"b":[1,{"c":null}]}}',
        '{"x":"é\\n","y":-0.5e3,"z":[[],[[]]]}',
        "[]",
        '{"a":1',
        '{"a":1}}',
        '{"a":[1,]}',
        "{'a':1}",
        '{"a":tru}',
        '"a"',
    ]
    for text in texts:
        matcher = grammar.matcher()
        ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
        kept = all(matcher.accept(t) for t in ids)
        try:
            is_object = isinstance(json.loads(text), dict)
        except ValueError:
            is_object = False
        assert kept == is_object, text


def steps_and_outputs(model, tokenizer, params, jump_forward, backend="auto", **engine_kwargs):
    """Each request alone in its own engine: the model calls (engine steps) it took and its
    output."""
    runs = []
    for p in params:
        engine = LLMEngine(model, tokenizer, structured_outputs_backend=backend,
                           jump_forward=jump_forward, **engine_kwargs)  # fmt: skip
        engine.add_request("r", "ROMEO.\n", p)
        run_to_end(engine)
        runs.append((engine.stats.steps, engine.requests["r"]))
    return runs


@pytest.mark.parametrize("backend", ["index", "xgrammar"])
def test_exact_jump_forward_gives_the_same_greedy_text_in_fewer_model_calls(shipped, backend):
    """Where exactly one token is allowed, appending it without sampling changes nothing a
    greedy request writes; it only saves the model calls that would have drawn it."""
    model, tokenizer = shipped
    params = [SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=CONSTRAINTS[k])
              for k in ("json", "choice", "regex")]  # fmt: skip
    plain = steps_and_outputs(model, tokenizer, params, None, backend)
    exact = steps_and_outputs(model, tokenizer, params, "exact", backend)
    for (steps, request), (fewer, same) in zip(plain, exact, strict=True):
        assert same.output_token_ids == request.output_token_ids
        assert same.finish_reason == request.finish_reason
        assert fewer <= steps
    assert sum(s for s, _ in exact) < sum(s for s, _ in plain)


def test_text_jump_forward_keeps_every_answer_valid_and_max_tokens(shipped):
    """The forced text, tokenized as the tokenizer writes it: every finished answer still
    keeps its constraint, in fewer model calls than tokens; no answer goes past max_tokens;
    the pool's invariants hold after every step, with preemptions."""
    model, tokenizer = shipped
    names = ["json", "json nested", "choice", "regex"] * 2
    params = [SamplingParams(max_tokens=48, seed=i, structured_outputs=CONSTRAINTS[n])
              for i, n in enumerate(names)]  # fmt: skip
    runs = steps_and_outputs(model, tokenizer, params, "text")
    for name, (steps, request) in zip(names, runs, strict=True):
        text = tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        if request.finish_reason == "stop":
            assert keeps(name, text), (name, text)
        assert steps <= len(request.output_token_ids) + 1
    assert sum(s for s, _ in runs) < sum(len(r.output_token_ids) for _, r in runs)
    short = SamplingParams(max_tokens=3, seed=0, structured_outputs=CONSTRAINTS["json"])
    [(_, request)] = steps_and_outputs(model, tokenizer, [short], "text")
    assert len(request.output_token_ids) == 3 and request.finish_reason == "length"
    tight = LLMEngine(model, tokenizer, num_blocks=10, block_size=8, jump_forward="text")
    for i, p in enumerate(params):
        tight.add_request(f"r{i}", "ROMEO.\n", p)
    run_to_end(tight)  # checks the invariants after every step
    assert tight.stats.preemptions > 0
    for i, name in enumerate(names):
        request = tight.requests[f"r{i}"]
        text = tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        assert request.finish_reason == "length" or keeps(name, text), (name, text)
