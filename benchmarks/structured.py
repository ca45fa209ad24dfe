"""Constrained decoding in chapter 8's engine (chapter 9): how often an answer breaks its
constraint, what the masks cost a step, and what compiling a constraint costs beside
outlines-core and xgrammar.

    python benchmarks/structured.py [--answers 1000] [--runs 7] [--threads 1] [--quick]

Prints one JSON object:

- `validity`: for each shipped model (GPT-2's block and the Llama block) and each kind of
  constraint (a regex, a choice, a flat JSON schema by the index; a JSON schema that refers to
  itself and an EBNF grammar by xgrammar), `--answers` seeded answers at temperature 1 through
  the engine, 64 at a time: how many finished (end-of-text within `--max-tokens`), how many of
  those keep their constraint by an outside check (`re.fullmatch`, `json.loads` and
  `jsonschema`, a balanced-parentheses check), and how many break it. An answer cut at
  `max_tokens` is unfinished, not invalid (vLLM and OpenAI end it with "length" too);
- `sampler_validity`: the same count through chapter 3's sampler (chapter 9's
  `ConstrainedSampler`, one answer per seed, `--sampler-answers` each) for the regex and the
  flat schema, on the GPT-2 model;
- `distortion`: after `ROMEO.\n`, one of four names (`(Romeo|Juliet|Tybalt|Mercutio)`), every
  answer enumerated with its exact probability conditioned on the constraint and under
  per-step masking (solutions/constraint_distortion.py): each name's two probabilities, and the
  KL divergence between them over the names and over the token paths;
- `mask_cost`: 32 requests decoding together, each under the flat schema, with the index
  backend and with xgrammar: the median time of the masks (every row filled, the bitmask
  applied) per step, over the median time of a whole step, in the same steps;
- `compile`: the flat two-field schema compiled by the course's index (regex, byte DFA, index,
  bitmask rows), by outlines-core (`build_regex_from_schema` and `Index`) and by xgrammar
  (`compile_json_schema`, its cache off), medians of interleaved runs, and the ratios;
- `jump_forward`: `--jf-answers` answers to the scene schema (speaker, act, a list of
  booleans), each alone in an engine, token by token and with each form of jump-forward
  (`exact`: where one token is allowed; `text`: the forced text as the tokenizer writes it):
  model calls (engine steps) per answer and per answer token, whether the greedy texts are
  token-by-token's, and how far the sampled answers move from token-by-token's, field by field
  (the speaker, the act, the number of lines): the total variation distance between the
  empirical distributions of that field, beside the same distance between the two halves of
  token-by-token's answers (sampling noise alone; with half the answers each, it overstates
  the noise a little);
- `goals`: 0 invalid answers of every kind on both models; the masks at most 10 % of a step at
  batch 32 (for each backend); 1.5 times fewer model calls per answer with the `text` form, its
  answers valid.

`--quick` is the smoke test of tests/machinery/benchmarks/test_structured_benchmark.py.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time

import jsonschema
import torch

from solutions.byte_dfa import regex_to_byte_dfa
from solutions.engine import LLMEngine, generate
from solutions.json_schema import schema_to_regex
from solutions.sampling_params import SamplingParams, StructuredOutputsParams
from solutions.structured_outputs import IndexGrammar
from solutions.token_bytes import token_bytes
from solutions.token_index import TokenIndex
from utils.models import load_model
from utils.records import add_record_options, emit, goal, machine, us_each
from utils.timing import interleaved_runs, ratio_within_runs, sig

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
SCENE = {
    "type": "object",
    "properties": {
        "speaker": {"enum": ["ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE"]},
        "act": {"enum": [1, 2, 3, 4, 5]},
        "lines": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["speaker", "act", "lines"],
}
TREE = {
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
REGEX = "[0-9]{3}-(yes|no)"
CHOICES = ["Romeo", "Juliet", "Romeo and Juliet"]
KINDS = {  # the constraint, and the outside check of a finished answer's text
    "regex": (StructuredOutputsParams(regex=REGEX), lambda t: re.fullmatch(REGEX, t) is not None),
    "choice": (StructuredOutputsParams(choice=CHOICES), lambda t: t in CHOICES),
    "json_flat": (StructuredOutputsParams(json=SCENE), lambda t: valid_json(t, SCENE)),
    "json_nested": (StructuredOutputsParams(json=TREE), lambda t: valid_json(t, TREE)),
    "grammar": (
        StructuredOutputsParams(grammar='root ::= "(" root ")" | "x"'),
        lambda t: t == "(" * (len(t) // 2) + "x" + ")" * (len(t) // 2),
    ),
}


def valid_json(text: str, schema: dict) -> bool:
    try:
        return jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    except ValueError:
        return False


def validity(model, tokenizer, answers: int, max_tokens: int) -> dict:
    """Each kind's answers, 64 at a time through one engine."""
    engine = LLMEngine(model, tokenizer, num_blocks=512, max_num_seqs=64,
                       max_num_batched_tokens=1024, keep_finished=False)  # fmt: skip
    counts = {}
    for kind, (constraint, keeps) in KINDS.items():
        finished = valid = 0
        for start in range(0, answers, 64):
            seeds = range(start, min(start + 64, answers))
            params = [SamplingParams(max_tokens=max_tokens, seed=s, temperature=1.0,
                                     structured_outputs=constraint) for s in seeds]  # fmt: skip
            for output in generate(engine, ["ROMEO.\n"] * len(params), params):
                if output.error is not None:
                    raise RuntimeError(f"{kind}: {output.error}")
                if output.finish_reason == "stop":
                    finished += 1
                    text = tokenizer.decode(output.output_token_ids, skip_special_tokens=True)
                    valid += keeps(text)
        counts[kind] = {"answers": answers, "finished": finished, "valid": valid,
                        "invalid": finished - valid}  # fmt: skip
    return counts


def mask_cost(model, tokenizer, steps: int, backend: str) -> dict:
    """32 requests under the flat schema, decoding: each step's masks (the manager's `apply`)
    and the whole step timed, in the same steps."""
    engine = LLMEngine(model, tokenizer, num_blocks=512, max_num_seqs=32,
                       structured_outputs_backend=backend)  # fmt: skip
    so = StructuredOutputsParams(json=PERSON)  # a long string: requests go on decoding
    for i in range(32):
        engine.add_request(f"r{i}", "ROMEO.\n", SamplingParams(
            max_tokens=steps + 10, seed=i, structured_outputs=so, ignore_eos=True))  # fmt: skip
    apply, masked = engine.structured.apply, []

    def timed_apply(requests, logits):
        began = time.perf_counter()
        out = apply(requests, logits)
        masked.append(time.perf_counter() - began)
        return out

    engine.structured.apply = timed_apply
    engine.step()  # the prompts (a prefill) and the first tokens
    masked.clear()
    step_times = []
    for _ in range(steps):
        began = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - began)
    return {
        "batch": 32,
        "steps": steps,
        "mask_us_per_step": us_each(masked, 1),
        "step_us": us_each(step_times, 1),
        "mask_share_of_step": sig(statistics.median(masked) / statistics.median(step_times), 3),
    }


def compile_times(tokenizer, runs: int) -> dict:
    """The two-field schema compiled three ways, interleaved runs."""
    import xgrammar as xgr
    from outlines_core import Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    vocab, eos, d_vocab = token_bytes(tokenizer), tokenizer.eos_token_id, len(tokenizer)
    table: dict[bytes, list[int]] = {}
    for i, data in enumerate(vocab):
        if data is not None:
            table.setdefault(data, []).append(i)
    outlines_vocab = Vocabulary(eos, table)
    info = xgr.TokenizerInfo([b or b"" for b in vocab], xgr.VocabType.RAW, vocab_size=d_vocab,
                             stop_token_ids=[eos])  # fmt: skip
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def course():
        grammar = IndexGrammar(schema_to_regex(PERSON), vocab, eos, d_vocab)
        return len(grammar.index.transitions)

    def index_only():  # the learner's part alone: DFA and index, no bitmask rows
        dfa = regex_to_byte_dfa(schema_to_regex(PERSON))
        return len(TokenIndex(dfa, vocab, eos).transitions)

    def outlines():
        regex = build_regex_from_schema(json.dumps(PERSON), whitespace_pattern="")
        return len(Index(regex, outlines_vocab).get_transitions())

    def xgrammar():
        compiler.compile_json_schema(PERSON, any_whitespace=False, separators=(",", ":"))
        return 0

    methods = {"course": course, "course_index_only": index_only, "outlines_core": outlines,
               "xgrammar": xgrammar}  # fmt: skip
    times, _ = interleaved_runs(methods, runs)
    return {
        "schema": "two fields (string, integer), compact",
        "states": {"course": course(), "outlines_core": outlines()},
        "ms": {name: sig(1e3 * statistics.median(t), 3) for name, t in times.items()},
        "course_over_outlines_core": ratio_within_runs(times, "outlines_core", "course"),
        "course_over_xgrammar": ratio_within_runs(times, "xgrammar", "course"),
    }


FIELDS = ("speaker", "act", "lines")  # the number of lines


def scene_values(text: str) -> tuple:
    value = json.loads(text)
    return value["speaker"], value["act"], len(value["lines"])


def total_variation(a: list, b: list) -> float:
    """Half the L1 distance between two empirical distributions."""
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.count(k) / len(a) - b.count(k) / len(b)) for k in keys)


def jump_forward(model, tokenizer, answers: int) -> dict:
    """The scene schema, each answer alone: greedy once, then `answers` seeded samples, for
    each form."""
    so = StructuredOutputsParams(json=SCENE)
    forms: dict[str, dict] = {}
    for form in (None, "exact", "text"):

        def run(params, form=form):
            engine = LLMEngine(model, tokenizer, jump_forward=form)
            output = generate(engine, ["ROMEO.\n"], params)[0]
            text = tokenizer.decode(output.output_token_ids, skip_special_tokens=True)
            return engine.stats.steps, len(output.output_token_ids), output.finish_reason, text

        greedy = run(SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=so))
        sampled = [run(SamplingParams(max_tokens=60, seed=s, structured_outputs=so))
                   for s in range(answers)]  # fmt: skip
        done = [r for r in sampled if r[2] == "stop"]
        forms[form or "none"] = {
            "greedy_text": greedy[3],
            "finished": len(done),
            "valid": sum(valid_json(r[3], SCENE) for r in done),
            "calls_per_answer": sig(sum(r[0] for r in done) / max(len(done), 1), 3),
            "calls_per_token": sig(sum(r[0] for r in done) / max(sum(r[1] for r in done), 1), 3),
            "tokens_per_answer": sig(sum(r[1] for r in done) / max(len(done), 1), 3),
            "values": [scene_values(r[3]) for r in done],
        }
    base = forms["none"]
    half = len(base["values"]) // 2
    out = {"answers": answers, "forms": {}}
    for name, f in forms.items():
        out["forms"][name] = {k: v for k, v in f.items() if k != "values"}
        out["forms"][name]["greedy_text_as_token_by_token"] = (
            f["greedy_text"] == base["greedy_text"]
        )
        out["forms"][name]["calls_per_answer_none_over_this"] = sig(
            base["calls_per_answer"] / f["calls_per_answer"], 3)  # fmt: skip
        out["forms"][name]["tv_from_none"] = {
            field: sig(total_variation([v[i] for v in f["values"]],
                                       [v[i] for v in base["values"]]), 3)
            for i, field in enumerate(FIELDS)
        }  # fmt: skip
    out["tv_between_halves_of_none"] = {
        field: sig(total_variation([v[i] for v in base["values"][:half]],
                                   [v[i] for v in base["values"][half:]]), 3)
        for i, field in enumerate(FIELDS)
    }  # fmt: skip
    return out


def sampler_validity(model, tokenizer, answers: int, max_tokens: int) -> dict:
    """Chapter 3's sampler, constrained, one answer per seed."""
    from solutions.constrained_sampling import ConstrainedSampler

    vocab, eos = token_bytes(tokenizer), tokenizer.eos_token_id
    prompt = tokenizer.encode("ROMEO.\n")
    counts = {}
    for kind in ("regex", "json_flat"):
        constraint, keeps = KINDS[kind]
        regex = REGEX if kind == "regex" else schema_to_regex(SCENE)
        sampler = ConstrainedSampler(model, tokenizer, TokenIndex(regex_to_byte_dfa(regex),
                                                                  vocab, eos))  # fmt: skip
        finished = valid = 0
        for seed in range(answers):
            out = sampler.sample(prompt, max_tokens, seed=seed, temperature=1.0)[len(prompt) :]
            out = out.tolist()
            if out and out[-1] == eos:
                finished += 1
                valid += keeps(b"".join(vocab[t] for t in out[:-1]).decode())
        counts[kind] = {"answers": answers, "finished": finished, "valid": valid,
                        "invalid": finished - valid}  # fmt: skip
    return counts


def distortion(model, tokenizer) -> dict:
    """Section 9 of chapter 9, recorded."""
    from solutions.constraint_distortion import (
        answer_probabilities,
        conditioned_and_masked,
        kl_divergence,
    )

    vocab, eos = token_bytes(tokenizer), tokenizer.eos_token_id
    regex = "(Romeo|Juliet|Tybalt|Mercutio)"
    index = TokenIndex(regex_to_byte_dfa(regex), vocab, eos)
    answers = answer_probabilities(model, tokenizer.encode("ROMEO.\n"), index)
    exact, masked, z = conditioned_and_masked(answers)

    def by_text(probabilities):
        texts: dict[str, float] = {}
        for path, p in probabilities.items():
            text = b"".join(vocab[t] for t in path[:-1]).decode()
            texts[text] = texts.get(text, 0.0) + p
        return texts

    exact_text, masked_text = by_text(exact), by_text(masked)
    return {
        "prompt": "ROMEO.\n",
        "regex": regex,
        "token_paths": len(answers),
        "z": sig(z, 3),
        "conditioned": {t: sig(p, 3) for t, p in exact_text.items()},
        "masked_each_step": {t: sig(p, 3) for t, p in masked_text.items()},
        "kl_conditioned_masked_texts_nats": sig(kl_divergence(exact_text, masked_text), 3),
        "kl_conditioned_masked_paths_nats": sig(kl_divergence(exact, masked), 3),
    }


def bench(args) -> dict:
    models = {"gpt2": load_model(args.gpt2), "llama": load_model(args.llama)}
    result = {"validity": {}, "mask_cost": {}}
    for name, (model, tokenizer) in models.items():
        result["validity"][name] = validity(model, tokenizer, args.answers, args.max_tokens)
    model, tokenizer = models["gpt2"]
    result["sampler_validity"] = sampler_validity(model, tokenizer, args.sampler_answers,
                                                  args.max_tokens)  # fmt: skip
    result["distortion"] = distortion(model, tokenizer)
    for backend in ("index", "xgrammar"):
        result["mask_cost"][backend] = mask_cost(model, tokenizer, args.steps, backend)
    result["compile"] = compile_times(tokenizer, args.runs)
    result["jump_forward"] = jump_forward(model, tokenizer, args.jf_answers)
    invalid = sum(k["invalid"] for m in result["validity"].values() for k in m.values())
    invalid += sum(k["invalid"] for k in result["sampler_validity"].values())
    result["goals"] = {
        "no_invalid_answer": goal("answers that break their constraint: the engine's, all kinds, "
                                  "both models, and the sampler's",
                                  invalid, 0, at_least=False),  # fmt: skip
        **{f"masks_at_most_10_percent_of_a_step_{b}": goal(
            "the masks' share of a decoding step at batch 32", c["mask_share_of_step"], 0.10,
            at_least=False) for b, c in result["mask_cost"].items()},
    }  # fmt: skip
    text = result["jump_forward"]["forms"]["text"]
    saving = goal("model calls per answer, token by token over the text form",
                  text["calls_per_answer_none_over_this"], 1.5, at_least=True)  # fmt: skip
    saving["met"] = saving["met"] and text["valid"] == text["finished"]
    result["goals"]["text_jump_forward_1_5x_fewer_calls_answers_valid"] = saving
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2", default="shakespeare")
    parser.add_argument("--llama", default="shakespeare-llama")
    parser.add_argument("--answers", type=int, default=1000, help="answers per kind and model")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=50, help="decoding steps timed")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sampler-answers", type=int, default=1000, help="per kind")
    parser.add_argument("--jf-answers", type=int, default=400, help="answers per jump-forward form")
    parser.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    parser.add_argument("--quick", action="store_true", help="tiny settings: the smoke test")
    add_record_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.answers, args.steps, args.runs, args.jf_answers = 8, 4, 2, 4
        args.sampler_answers = 4
    if min(args.answers, args.max_tokens, args.steps, args.runs, args.threads) < 1:
        parser.error("--answers, --max-tokens, --steps, --runs and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    emit({"machine": machine(), "cpu": bench(args)}, args)


if __name__ == "__main__":
    main()
