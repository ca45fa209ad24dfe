"""Structured outputs in the engine: each request's constraint compiled once, its state kept
with the request, and the masks of a whole batch applied in one operation (vLLM's
`StructuredOutputManager` and its backends, `vllm/v1/structured_output/`).

Two backends, one interface. A compiled **grammar** is shared by every request with the same
constraint; each request gets its own **matcher** (its place in the constraint), which fills
its row of the batch's bitmask and accepts each token the request samples.

- `index`: chapter 9's own machinery, for what a regex can say: a regex, a choice of strings,
  and the JSON schemas `check_schema` takes. The index's allowed sets are packed into bitmask
  rows once, when it is compiled, so a step copies one row per request.
- `xgrammar` (Dong et al., 2024): a pushdown automaton, for what needs a stack: EBNF grammars,
  JSON schemas that nest without a bound (`$ref`, an object with no properties) and the other
  keywords listed in `XGRAMMAR_KEYWORDS`, and `json_object` (any JSON object).

`backend="auto"` (the default, as vLLM's) takes the index where it can and xgrammar for the
rest; a constraint neither can keep is refused with a ValueError that names what is refused,
never served unconstrained. JSON is compact under both (no whitespace between tokens).

Where the state lives, and why preemption and prefix caching leave it right: the matcher
belongs to the request and has read exactly its output tokens. A preempted request keeps its
tokens and is recomputed from them; a prefix-cache hit skips computing keys and values, never
tokens. Neither changes which tokens the request has, so the matcher is saved as it is, not
rebuilt.

Compiling is never done on the engine loop's critical path in the server: the handler compiles
(`compile`, in a worker thread) before it hands the request to the loop, and the engine's own
call finds it in the cache. The cache is keyed by the constraint and bounded (least recently
used out), so a server that runs for days does not keep every schema it was ever sent.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict

import torch
from jaxtyping import Float
from torch import Tensor

from solutions.byte_dfa import regex_to_byte_dfa
from solutions.json_schema import ANNOTATIONS, check_schema, schema_to_regex
from solutions.jump_forward import forced_text
from solutions.sampling_params import StructuredOutputsParams
from solutions.token_bitmask import apply_token_bitmask, bitmask_of, bitmask_width
from solutions.token_bytes import token_bytes
from solutions.token_index import TokenIndex

BACKENDS = ("auto", "index", "xgrammar")
JUMP_FORWARD = (None, "exact", "text")

# The JSON-schema keywords sent to xgrammar beyond `check_schema`'s subset, each checked in the
# tests by validating sampled answers with `jsonschema`. Any other keyword is refused by name.
XGRAMMAR_KEYWORDS = ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "anyOf", "$ref", "$defs", "minimum", "maximum", "minLength", "maxLength",
}  # fmt: skip


class IndexGrammar:
    """A constraint compiled by chapter 9's index: one bitmask row per DFA state."""

    def __init__(self, regex: str, vocab: list[bytes | None], eos_id: int, d_vocab: int):
        self.index = TokenIndex(regex_to_byte_dfa(regex), vocab, eos_id)
        self.eos_id = eos_id
        n_states = len(self.index.transitions)
        self.rows = torch.stack([bitmask_of(self.index.allowed(s), d_vocab)
                                 for s in range(n_states)])  # fmt: skip
        self.ended = bitmask_of([eos_id], d_vocab)  # after end-of-text: only end-of-text again

    def matcher(self) -> IndexMatcher:
        return IndexMatcher(self)


class IndexMatcher:
    """One request's state in an `IndexGrammar`."""

    def __init__(self, grammar: IndexGrammar):
        self.grammar, self.state, self.terminated = grammar, grammar.index.initial, False

    def fill(self, bitmask: Tensor, row: int) -> None:
        bitmask[row] = self.grammar.ended if self.terminated else self.grammar.rows[self.state]

    def accept(self, token: int) -> bool:
        """Move past `token`; False if the constraint refuses it (the state is then unchanged)."""
        if self.terminated:
            return token == self.grammar.eos_id
        next_state = self.grammar.index.transitions[self.state].get(token)
        if next_state is None:
            return False
        self.state, self.terminated = next_state, token == self.grammar.eos_id
        return True

    def only_token(self) -> int | None:
        """The one token allowed now, if exactly one is (end-of-text never counts: it ends)."""
        row = self.grammar.index.transitions[self.state]
        if self.terminated or len(row) != 1:
            return None
        (token,) = row
        return None if token == self.grammar.eos_id else token

    def forced_text(self) -> str:
        """The text the constraint allows as the only continuation from here."""
        return "" if self.terminated else forced_text(self.grammar.index.dfa, self.state)


class XGrammarGrammar:
    """A constraint compiled by xgrammar (its `CompiledGrammar`)."""

    def __init__(self, compiled, eos_id: int, d_vocab: int):
        self.compiled, self.eos_id = compiled, eos_id
        self.ended = bitmask_of([eos_id], d_vocab)

    def matcher(self) -> XGrammarMatcher:
        return XGrammarMatcher(self)


class XGrammarMatcher:
    """One request's state in an `XGrammarGrammar` (xgrammar's `GrammarMatcher`)."""

    def __init__(self, grammar: XGrammarGrammar):
        import xgrammar as xgr

        self.grammar = grammar
        self.inner = xgr.GrammarMatcher(grammar.compiled)

    def fill(self, bitmask: Tensor, row: int) -> None:
        if self.inner.is_terminated():
            bitmask[row] = self.grammar.ended
        else:
            self.inner.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        if self.inner.is_terminated():
            return token == self.grammar.eos_id
        return self.inner.accept_token(token)

    def only_token(self) -> int | None:
        if self.inner.is_terminated():
            return None
        row = torch.full((1, len(self.grammar.ended)), -1, dtype=torch.int32)
        self.inner.fill_next_token_bitmask(row, 0)
        bits = ((row[0][:, None] >> torch.arange(32)) & 1).flatten().nonzero().flatten()
        if len(bits) != 1 or int(bits[0]) == self.grammar.eos_id:
            return None
        return int(bits[0])

    def forced_text(self) -> str:
        return "" if self.inner.is_terminated() else self.inner.find_jump_forward_string()


def xgrammar_refusal(schema, where: str = "the schema") -> str | None:
    """Why xgrammar's path would not keep `schema` exactly (a keyword not in
    `XGRAMMAR_KEYWORDS`, extra properties allowed), or None."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, dict):
        return f"{where} must be a JSON object, got {type(schema).__name__}"
    unknown = sorted(set(schema) - XGRAMMAR_KEYWORDS)
    if unknown:
        return f"{where}: the keyword {unknown[0]!r} is not supported"
    if schema.get("additionalProperties", False) is not False:
        return f"{where}: additionalProperties must be false (or absent)"
    parts = [(f"{where}.items", schema["items"])] if "items" in schema else []
    parts += [(f"{where}.properties.{k}", v) for k, v in schema.get("properties", {}).items()]
    parts += [(f"{where}.anyOf[{i}]", v) for i, v in enumerate(schema.get("anyOf", []))]
    parts += [(f"{where}.$defs.{k}", v) for k, v in schema.get("$defs", {}).items()]
    for part_where, part in parts:
        why = xgrammar_refusal(part, part_where)
        if why is not None:
            return why
    return None


def regex_problem(regex: str, error: Exception) -> str:
    """Why a regex was refused, in words: interegular's syntax errors carry no message (an
    unclosed group says nothing), so Python's own parser is asked first."""
    try:
        re.compile(regex)
    except re.error as python_says:
        return str(python_says)
    return str(error) or f"{type(error).__name__} (a construct the index's regex parser lacks)"


class StructuredOutputManager:
    """Compiles constraints (cached) and applies the batch's masks. The engine owns one."""

    def __init__(self, tokenizer, d_vocab: int, backend: str = "auto", cache_size: int = 64):
        if backend not in BACKENDS:
            raise ValueError(f"structured_outputs_backend must be one of {BACKENDS}, got "
                             f"{backend!r}")  # fmt: skip
        self.tokenizer, self.d_vocab, self.backend = tokenizer, d_vocab, backend
        self.eos_id = tokenizer.eos_token_id
        self.cache_size = cache_size
        self.cache: OrderedDict[tuple, IndexGrammar | XGrammarGrammar] = OrderedDict()
        self.lock = threading.Lock()  # handlers compile in worker threads: the cache's lock
        self.setup_lock = threading.Lock()  # and the vocabulary's and xgrammar's, made once
        self._vocab: list[bytes | None] | None = None
        self._xgrammar_compiler = None

    @property
    def vocab(self) -> list[bytes | None]:
        with self.setup_lock:
            if self._vocab is None:
                self._vocab = token_bytes(self.tokenizer)
        return self._vocab

    def compile(self, params: StructuredOutputsParams) -> IndexGrammar | XGrammarGrammar:
        """The compiled grammar of `params` (from the cache if it was compiled before). A
        constraint no backend can keep raises a ValueError that names it."""
        key = (self.backend, *params.key)
        with self.lock:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
        grammar = self._compile(params)
        with self.lock:
            self.cache[key] = grammar
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        return grammar

    def _compile(self, params: StructuredOutputsParams) -> IndexGrammar | XGrammarGrammar:
        kind = params.kind
        if kind == "choice":
            regex = "(" + "|".join(re.escape(c) for c in params.choice) + ")"
            return self._regex(regex, "choice")
        if kind == "regex":
            return self._regex(params.regex, "regex")
        if kind == "json":
            schema = params.json
            if self.backend != "xgrammar":
                try:
                    check_schema(schema)
                    return self._regex(schema_to_regex(schema), "json")
                except ValueError as error:
                    if self.backend == "index":
                        raise ValueError(f"structured_outputs.json: {error}") from None
                    why = xgrammar_refusal(schema)
                    if why is not None:
                        raise ValueError(
                            f"structured_outputs.json: {why} (neither the index, which says: "
                            f"{error}; nor xgrammar)"
                        ) from None
            else:
                why = xgrammar_refusal(schema)
                if why is not None:
                    raise ValueError(f"structured_outputs.json: {why}")
            return self._xgrammar("json", schema)
        if self.backend == "index":
            raise ValueError(f"structured_outputs.{kind} needs the xgrammar backend")
        return self._xgrammar(kind, params.grammar)

    def _regex(self, regex: str, what: str) -> IndexGrammar | XGrammarGrammar:
        if self.backend == "xgrammar":
            return self._xgrammar("regex", regex)
        try:
            return IndexGrammar(regex, self.vocab, self.eos_id, self.d_vocab)
        except Exception as error:  # interegular's parse errors are not ValueErrors
            raise ValueError(f"structured_outputs.{what}: cannot compile {regex!r}: "
                             f"{regex_problem(regex, error)}") from None  # fmt: skip

    def _xgrammar(self, kind: str, spec) -> XGrammarGrammar:
        import xgrammar as xgr

        vocab = self.vocab
        with self.setup_lock:
            if self._xgrammar_compiler is None:
                padded = [b or b"" for b in vocab] + [b""] * (self.d_vocab - len(vocab))
                info = xgr.TokenizerInfo(padded, xgr.VocabType.RAW, vocab_size=self.d_vocab,
                                         stop_token_ids=[self.eos_id])  # fmt: skip
                self._xgrammar_compiler = xgr.GrammarCompiler(info, max_threads=1)
        compiler = self._xgrammar_compiler
        compact = {"any_whitespace": False, "separators": (",", ":"), "strict_mode": True}
        try:
            if kind == "json":
                compiled = compiler.compile_json_schema(spec, **compact)
            elif kind == "json_object":
                compiled = compiler.compile_json_schema({"type": "object"}, **compact)
            elif kind == "regex":
                compiled = compiler.compile_regex(spec)
            else:
                compiled = compiler.compile_grammar(spec)
        except RuntimeError as error:  # xgrammar's parse errors
            raise ValueError(f"structured_outputs.{kind}: xgrammar cannot compile it: "
                             f"{str(error).strip().splitlines()[-1]}") from None  # fmt: skip
        return XGrammarGrammar(compiled, self.eos_id, self.d_vocab)

    def forced_tokens(self, matcher, form: str, limit: int) -> list[int]:
        """Tokens the constraint forces next, at most `limit`, each accepted by `matcher`
        (SGLang's jump-forward). `form` "exact": while exactly one token is allowed, that token,
        which token-by-token decoding would have drawn with probability 1. "text": the forced
        text (what the constraint allows as the only continuation), tokenized as the tokenizer
        writes it: fewer tokens, but one tokenization of that text where the model might have
        drawn another, so the answers' distribution changes."""
        tokens: list[int] = []
        if form == "exact":
            while len(tokens) < limit and (token := matcher.only_token()) is not None:
                matcher.accept(token)
                tokens.append(token)
            return tokens
        text = matcher.forced_text()
        for token in self.tokenizer.encode(text)[:limit] if text else []:
            if not matcher.accept(token):  # a tokenization the constraint refuses: stop there
                break
            tokens.append(token)
        return tokens

    def apply(self, requests: list, logits: Float[Tensor, "R d_vocab"]) -> Tensor:
        """The logits with each constrained request's mask applied (row i is `requests[i]`'s),
        one bitmask for the whole batch; an unconstrained row's bits are all ones."""
        rows = [i for i, r in enumerate(requests) if r.matcher is not None]
        if not rows:
            return logits
        bitmask = torch.full((len(requests), bitmask_width(self.d_vocab)), -1, dtype=torch.int32)
        for i in rows:
            requests[i].matcher.fill(bitmask, i)
        return apply_token_bitmask(logits, bitmask.to(logits.device))
