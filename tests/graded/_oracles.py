"""Ground truths and shared constants of the graded tests, each declared once.

Test files import every oracle, prompt and closeness bound from here. The HF oracles that a
chapter also runs in front of the learner (greedy `generate`, beam search, the tokens a logits
warper keeps) are defined in `utils/hf_oracles.py`, because a notebook can import `utils` but
not `tests`, and are re-exported here; so are the few that the machinery's and the peers' tests
share (`tests/support.py`: this module is private to `tests/graded`); the ones only graded tests
need are defined below.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import torch
from transformers import GPT2LMHeadModel

from tests.graded._explain import explain_difference, sentences
from tests.support import IN_PLACE, LLAMA_MODEL, N_SAMPLES, assert_untouched, hf_static_greedy
from utils.hf_oracles import hf_beam_search, hf_greedy, hf_kept

__all__ = [
    "BATCH_PROMPTS",
    "IN_PLACE",
    "N_SAMPLES",
    "assert_untouched",
    "crafted_logits",
    "draw",
    "BEAM_SCORE_ATOL",
    "F32_ATOL",
    "F32_RTOL",
    "PROMPT",
    "PROMPTS",
    "ROUNDED_TOP_P_CASES",
    "assert_close_f32",
    "explain_difference",
    "sentences",
    "exact_top_p_count",
    "rounded_top_p_cases_here",
    "hf_beam_search",
    "hf_greedy",
    "hf_static_greedy",
    "hf_kept",
    "hf_window_greedy",
    "LLAMA_MODEL",
    "SMALL_LLAMA",
    "hf_attention",
    "hf_cos_sin",
    "hf_layer0_keys",
    "hf_layer0_values",
    "hf_llama_logits",
    "hf_llama_mistake_logits",
    "LLAMA_MISTAKES",
    "hf_qkv",
    "hf_rotate",
    "random_hf_llama",
    "shipped_llama",
    "OutlinesIndex",
    "vocabulary_bytes",
    "outlines_schema_regex",
    "RFC_STRING_CHAR",
    "regex_difference",
]

# --------------------------------------------------------------------------- prompts

PROMPT = (
    "MACBETH.\nSo foul and fair a day I have not seen.\n\nBANQUO.\nHow far is't call'd to Forres?"
)
"""The reference model's activations are taken on this prompt: from a held-out play (Macbeth),
35 tokens, long enough for attention to matter."""

PROMPTS = [
    "MACBETH.\nIs this a dagger which I see before me,",
    "VIOLA.\nWhat country, friends, is this?\n\nCAPTAIN.\n",
    "KING HENRY.\nOnce more unto the breach, dear friends, once more;",
]
"""Three openings to generate from (18, 21 and 18 tokens): chapter 3's sampling and beam search
are compared with HF's `generate` on each."""

BATCH_PROMPTS = [
    "MACBETH.\nIs this a dagger which I see before me,",
    "VIOLA.\nWhat",
    "KING HENRY.\nOnce more unto the breach, dear friends, once more;",
]
"""Chapter 4's prompts: 18, 6 and 18 tokens, so that a left-padded batch of them has a row that
is mostly padding, and each row must still generate what it would alone."""

# --------------------------------------------------------------------------- closeness bounds

F32_ATOL, F32_RTOL = 1e-4, 1e-3
"""Float32 activations and logits of the course's model against the reference (transformer-lens,
HF): two implementations sum in different orders and differ in the last digits; a real mistake
lands far outside these bounds."""

BEAM_SCORE_ATOL = 2e-3
"""A beam's score (a sum of up to a few dozen float32 log-probabilities) against HF's."""


def close_f32(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal within float32 rounding (the bounds of `assert_close_f32`), shapes included."""
    return actual.shape == expected.shape and torch.allclose(
        actual, expected, atol=F32_ATOL, rtol=F32_RTOL
    )


def assert_close_f32(
    actual: torch.Tensor,
    expected: torch.Tensor,
    msg: str,
    *,
    axes: tuple[str, ...] | None = None,
    hint: str = "",
) -> None:
    """Equal within float32 rounding (`F32_ATOL`, `F32_RTOL`), dtype and device included, or
    fail with `msg` (what was compared), then how the two differ (`explain_difference`, with
    expected's dimensions named by `axes`), then `hint` (the slip that difference points to)."""
    if (
        isinstance(actual, torch.Tensor)
        and actual.dtype == expected.dtype
        and actual.device == expected.device
        and close_f32(actual, expected)
    ):
        return
    how = explain_difference(actual, expected, axes, atol=F32_ATOL, rtol=F32_RTOL)
    raise AssertionError(sentences(msg, how, hint))


# --------------------------------------------------------------------------- generation


def hf_window_greedy(
    hf_model: GPT2LMHeadModel,
    ids: list[int],
    max_new_tokens: int,
    window_start: Callable[[int, int], int],
) -> list[int]:
    """Greedy decoding where step t reads only ids[window_start(t, len(ids)):], by HF's logits.

    The ground truth for text longer than the context window, where `generate` cannot go (the
    model has `n_positions` learned positions): the HF model is called on exactly the window
    that the rule under test says the model reads.
    """
    ids = list(ids)
    for t in range(max_new_tokens):
        start = window_start(t, len(ids))
        with torch.no_grad():
            logits = hf_model(torch.tensor([ids[start:]])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids


# --------------------------------------------------------------------------- sampling checks


def first_difference(got, expected) -> int:
    """Where two sequences (token ids, texts) first differ; the shorter one's length when it is a
    prefix of the other."""
    return next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )


def crafted_logits(seed: int = 0, d_vocab: int = 24) -> torch.Tensor:
    """A logit vector with a spread of probabilities, from near 0.3 to near 0."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(d_vocab, generator=g) * 1.5


def draw(fn, logits: torch.Tensor, n: int = N_SAMPLES, seed: int = 0, who: str = "", **kwargs):
    """n samples from one logit vector, as one batch of n identical rows (the test's own batch,
    handed over as it is and checked afterwards: it must come back unchanged)."""
    batch = logits.expand(n, -1).clone()
    out = fn(batch, generator=torch.Generator().manual_seed(seed), **kwargs)
    assert_untouched(
        batch, logits.expand(n, -1), who or getattr(fn, "__name__", "sampler"), IN_PLACE
    )
    assert out.shape == (n,), f"expected one token per row, shape ({n},), got {tuple(out.shape)}"
    assert out.dtype == torch.int64, f"expected token ids as int64, got {out.dtype}"
    return out


# --------------------------------------------------------------------------- top-p boundaries

# The top-p line reached through rounding: decimal probabilities, top_p equal to the total of
# the most likely ones (chapter 3's filter and chapter 10's kernel are both graded on them). HF's
# own case first (its test_top_p_dist_warper): 0.5 + 0.3 reaches 0.8. No tie straddles a line.
ROUNDED_TOP_P_CASES = [
    ([0.3, 0.1, 0.1, 0.5], 0.8),
    ([0.1, 0.35, 0.45, 0.1], 0.8),
    ([0.4, 0.24, 0.08, 0.2, 0.08], 0.4),
    ([0.5, 0.1, 0.4], 0.5),
    ([0.64, 0.36], 0.64),
    ([0.28, 0.32, 0.04, 0.36], 0.36),
    ([0.4, 0.36, 0.24], 0.4),
    ([0.14, 0.26, 0.04, 0.4, 0.16], 0.4),
]


def rounded_top_p_cases_here() -> list[tuple[list[float], float]]:
    """The ROUNDED_TOP_P_CASES on which HF's kept set is the exact one on this CPU. HF sums the
    float32 probabilities from the least likely up; a CPU's softmax rounds them its own way, so
    on some machines a case lands on the other side of top_p in HF's sum than in the exact one:
    there the oracle is ambiguous and the case is left out (never more than two)."""
    from transformers import TopPLogitsWarper

    usable = []
    for probs, top_p in ROUNDED_TOP_P_CASES:
        logits = torch.tensor(probs).log()
        n_hf = int(hf_kept(TopPLogitsWarper(top_p=top_p), logits[None])[0].sum())
        if n_hf == exact_top_p_count(logits, top_p):
            usable.append((probs, top_p))
    assert len(usable) >= len(ROUNDED_TOP_P_CASES) - 2, (
        f"test set-up: HF's top-p and the exact sums differ on "
        f"{len(ROUNDED_TOP_P_CASES) - len(usable)} of the rounded cases on this CPU"
    )
    return usable


def exact_top_p_count(logits: torch.Tensor, top_p: float) -> int:
    """How many tokens the definition keeps, with the float32 probabilities summed exactly
    (float64 is exact for a few of them): the smallest most-likely set reaching top_p."""
    probs = logits.softmax(-1).double().sort(descending=True).values
    before = torch.cat([torch.zeros(1, dtype=torch.float64), probs.cumsum(0)[:-1]])
    return max(1, int((before < top_p).sum()))


# --------------------------------------------------------------------------- Llama (chapter 7)

SMALL_LLAMA = dict(
    d_model=42, d_vocab=50, n_ctx=64, d_head=8, d_mlp=72, n_heads=6, n_kv_heads=2, n_layers=2,
    rms_norm_eps=1e-3, rope_theta=500000.0,
)  # fmt: skip
"""A random Llama whose every size differs (d_model 42, d_mlp 72, 6 query heads of 8, 2 key/value
heads, 50 tokens), with an epsilon other than 1e-5 and a rope_theta other than 10000: a constant
copied from elsewhere, or two axes confused, shows."""


@functools.cache
def shipped_llama():
    """(HF LlamaForCausalLM with eager attention, tokenizer) of the shipped Llama model, float32.
    Shared by the tests of a run: never change it in place."""
    from utils.models import load_hf

    hf, tokenizer = load_hf(LLAMA_MODEL)
    hf.set_attn_implementation("eager")
    return hf.eval(), tokenizer


def random_hf_llama(seed: int = 0, tie: bool = False, **fields):
    """An HF LlamaForCausalLM with random weights for SMALL_LLAMA (fields override it), eager
    attention, and norm weights that are not all one (so that a forgotten weight shows)."""
    from transformers import LlamaForCausalLM

    from solutions.llama_config import LlamaConfig
    from utils.convert import hf_llama_config

    cfg = LlamaConfig(**{**SMALL_LLAMA, **fields})
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(hf_llama_config(cfg, tie_embeddings=tie))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
            else:  # HF's init (std 0.02) would make every layer nearly the identity
                p.normal_(0, 0.2)
    hf.set_attn_implementation("eager")
    return hf.eval()


def hf_cos_sin(hf_config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's LlamaRotaryEmbedding's cosines and sines [batch, posn, d_head] at `positions`."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(hf_config)
    return rotary(torch.zeros(1, dtype=torch.float32), positions)


def hf_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's apply_rotary_pos_emb on one tensor [batch, heads, posn, d_head]."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def hf_qkv(attn, x: torch.Tensor, positions: torch.Tensor, hf_config):
    """An HF LlamaAttention's queries and keys after rotation, and values, heads first."""
    d_head = attn.head_dim

    def heads(proj):
        return proj(x).unflatten(-1, (-1, d_head)).transpose(1, 2)

    cos, sin = hf_cos_sin(hf_config, positions)
    return (
        hf_rotate(heads(attn.q_proj), cos, sin),
        hf_rotate(heads(attn.k_proj), cos, sin),
        heads(attn.v_proj),
    )


def hf_attention(
    attn, x: torch.Tensor, positions: torch.Tensor, hf_config, causal: bool = True
) -> torch.Tensor:
    """An HF LlamaAttention (eager) on `x` [batch, posn, d_model], causal (or every query reading
    every key, to name a mask left out), at `positions`."""
    n = x.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # HF's eager mask is added
    mask = mask if causal else None
    with torch.no_grad():
        out, _ = attn(x, position_embeddings=hf_cos_sin(hf_config, positions), attention_mask=mask)
    return out


def hf_layer0_keys(hf, tokens: torch.Tensor, positions: torch.Tensor, norm: str = "ln1"):
    """(rotated, unrotated) keys of layer 0 [batch, n_kv_heads, posn, d_head] by HF's modules:
    layer 0 reads the embeddings alone, so its keys at any position follow from the tokens.
    `norm` is the norm the attention reads through: "ln1" (HF's), or, to name a mistake,
    "none" (the stream itself) or "ln2" (the MLP's norm)."""
    if norm not in ("ln1", "none", "ln2"):
        raise ValueError(f"norm must be 'ln1', 'none' or 'ln2', got {norm!r}")
    layer = hf.model.layers[0]
    with torch.no_grad():
        x = hf.model.embed_tokens(tokens)
        norms = {"ln1": layer.input_layernorm, "ln2": layer.post_attention_layernorm}
        x = norms[norm](x) if norm in norms else x
        k = layer.self_attn.k_proj(x).unflatten(-1, (-1, layer.self_attn.head_dim)).transpose(1, 2)
        cos, sin = hf_cos_sin(hf.config, positions)
    return hf_rotate(k, cos, sin), k


def hf_layer0_values(hf, tokens: torch.Tensor) -> torch.Tensor:
    """Values of layer 0 [batch, n_kv_heads, posn, d_head] by HF's modules (never rotated)."""
    layer = hf.model.layers[0]
    with torch.no_grad():
        x = layer.input_layernorm(hf.model.embed_tokens(tokens))
        v = layer.self_attn.v_proj(x)
    return v.unflatten(-1, (-1, layer.self_attn.head_dim)).transpose(1, 2)


LLAMA_MISTAKES = (
    "no final norm",
    "mlp reads resid_pre",
    "no mlp residual",
    "ln1 before the mlp",
    "post-norm",
    "embeddings scaled",
    "no causal mask",
    "norms swapped",
    "block output added again",
    "tied unembedding",
    "no attention residual",
    "attention added to its norm",
    "mlp added to its norm",
    "mlp output normed",
    "mlp reads resid_mid unnormed",
    "no mlp",
    "attention reads resid_pre unnormed",
    "ln2 before the attention",
    "mlp reads the attention's output alone",
    "last block's ln2 as the final norm",
)
"""The model-level slips that hf_llama_mistake_logits computes with HF's modules."""


def hf_llama_mistake_logits(hf, ids: torch.Tensor, mistake: str) -> torch.Tensor:
    """HF LlamaForCausalLM's logits for `ids` [batch, posn], computed layer by layer with its own
    modules (embed_tokens, input_layernorm, self_attn, post_attention_layernorm, mlp, norm,
    lm_head) with one of LLAMA_MISTAKES made, or none ("" gives HF's own logits): to name the
    slip a learner's model made."""
    if mistake not in ("", *LLAMA_MISTAKES):
        raise ValueError(f"mistake must be one of {LLAMA_MISTAKES} or '', got {mistake!r}")
    positions = torch.arange(ids.shape[1]).expand(ids.shape)
    with torch.no_grad():
        x = hf.model.embed_tokens(ids)
        if mistake == "embeddings scaled":
            x = x * hf.config.hidden_size**0.5
        for layer in hf.model.layers:
            ln1, ln2 = layer.input_layernorm, layer.post_attention_layernorm
            if mistake == "norms swapped":
                ln1, ln2 = ln2, ln1
            before = x
            attn_in = {"post-norm": x, "attention reads resid_pre unnormed": x,
                       "ln2 before the attention": ln2(x)}.get(mistake, ln1(x))  # fmt: skip
            a = hf_attention(
                layer.self_attn, attn_in, positions, hf.config, mistake != "no causal mask"
            )
            if mistake == "post-norm":
                mid = ln1(x + a)
                x = ln2(mid + layer.mlp(mid))
                continue
            mid = {"no attention residual": a, "attention added to its norm": attn_in + a}.get(
                mistake, x + a
            )
            mlp_in = {"mlp reads resid_pre": ln2(x), "ln1 before the mlp": ln1(mid),
                      "mlp reads resid_mid unnormed": mid,
                      "mlp reads the attention's output alone": ln2(a)}  # fmt: skip
            m = layer.mlp(mlp_in.get(mistake, ln2(mid)))
            if mistake == "mlp output normed":
                m = ln2(layer.mlp(mid))
            if mistake == "no mlp":
                m = torch.zeros_like(mid)
            x = {"no mlp residual": m, "mlp added to its norm": ln2(mid) + m}.get(mistake, mid + m)
            x = before + x if mistake == "block output added again" else x
        if mistake == "last block's ln2 as the final norm":
            x = hf.model.layers[-1].post_attention_layernorm(x)
        elif mistake != "no final norm":
            x = hf.model.norm(x)
        if mistake == "tied unembedding":
            return x @ hf.model.embed_tokens.weight.T
        return hf.lm_head(x)


def hf_llama_logits(hf, rows: list[list[int]]) -> list[torch.Tensor]:
    """HF LlamaForCausalLM's logits [len(row), d_vocab] for each row alone (no padding)."""
    with torch.no_grad():
        return [hf(torch.tensor([row])).logits[0] for row in rows]


# --------------------------------------------------------------------------- chapter 9: constraints


@functools.cache
def vocabulary_bytes(model: str = "shakespeare") -> tuple[tuple[bytes | None, ...], int]:
    """Each token id's bytes (None for a special token) and the end-of-text id, read from the
    model's tokenizer.json with HF's own copy of GPT-2's byte map (transformers'
    `convert_slow_tokenizer.bytes_to_unicode`), not with the course's code."""
    import json

    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from utils.models import model_dir

    spec = json.loads((model_dir(model) / "tokenizer.json").read_text(encoding="utf-8"))
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    special = {t["content"]: t["id"] for t in spec["added_tokens"] if t["special"]}
    vocab: list[bytes | None] = [None] * len(spec["model"]["vocab"])
    for string, i in spec["model"]["vocab"].items():
        vocab[i] = None if string in special else bytes(byte_of[c] for c in string)
    return tuple(vocab), special["<|endoftext|>"]


class OutlinesIndex:
    """outlines-core's `Index` of a regex over a vocabulary of byte strings, read with the
    semantics of Python's `re.fullmatch`: the oracle of chapter 9's token index.

    outlines-core 0.2.14's index differs from `re.fullmatch` where a proper prefix of an answer
    is already a complete match: it refuses a token that crosses that point (after `1`, the
    token `.` for `-?[0-9]+(\\.[0-9]+)?`), and it keeps the regex crate's leftmost-first
    priority (`(Rom|Romeo)` never accepts `Romeo`). Both vanish when the regex is followed by a
    sentinel character S that it never matches: `(?:R)S` has complete matches only at its end.
    So the index is built for `(?:R)S`, with S given one extra token id outside the vocabulary,
    and read back: a state is final where S is allowed; its allowed tokens are the wrapped ones
    minus S and minus those whose bytes run into S, plus end-of-text where final.

    States are outlines-core's own numbers: compare with another index by walking both."""

    SENTINELS = ("\x01", "\x00", "\n", "~")

    def __init__(self, regex: str, vocab: tuple[bytes | None, ...] | list, eos_id: int):
        from outlines_core import Index, Vocabulary

        self.eos_id = eos_id
        self.sentinel_id = len(vocab)  # an id no model token has
        for sentinel in self.SENTINELS:
            table: dict[bytes, list[int]] = {}
            for i, data in enumerate(vocab):
                if data is not None and i != eos_id:
                    table.setdefault(data, []).append(i)
            table.setdefault(sentinel.encode(), []).append(self.sentinel_id)
            index = Index(f"(?:{regex}){re.escape(sentinel)}", Vocabulary(eos_id, table))
            rows = index.get_transitions()
            # Usable only if every step on S lands in one state that can only end: otherwise
            # the regex itself reads S somewhere.
            ends = {row[self.sentinel_id] for row in rows.values() if self.sentinel_id in row}
            if len(ends) == 1:
                (end,) = ends
                if set(rows.get(end, {})) == {eos_id}:
                    break
        else:
            raise ValueError(f"no sentinel in {self.SENTINELS} works for {regex!r}")
        self.rows, self.end = rows, end
        self.initial = index.get_initial_state()

    def is_final(self, state) -> bool:
        return self.sentinel_id in self.rows.get(state, {})

    def allowed(self, state) -> set[int]:
        row = self.rows.get(state, {})
        ids = {t for t, nxt in row.items() if nxt != self.end and t != self.sentinel_id}
        ids.discard(self.eos_id)
        if self.is_final(state):
            ids.add(self.eos_id)
        return ids

    def next_state(self, state, token: int):
        """The state after `token` (None when refused; end-of-text leaves a final state as it
        is, as the course's index does)."""
        if token == self.eos_id:
            return state if self.is_final(state) else None
        nxt = self.rows.get(state, {}).get(token)
        return None if nxt is None or nxt == self.end else nxt


# JSON's own string character and exponent (RFC 8259, sections 6-7), written here apart from the
# course's code: outlines-core 0.2.14's schema regex leaves out `\uXXXX` escapes and the
# characters U+007F-U+009F from strings, and requires a sign in an exponent; JSON has all three.
RFC_STRING_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9A-Fa-f]{4})'
RFC_EXPONENT = r"([eE][+-]?[0-9]+)?"


def outlines_schema_regex(schema: dict) -> str:
    """outlines-core's `build_regex_from_schema` of `schema`, with no whitespace between tokens
    (`whitespace_pattern=""`), its string character and exponent replaced by JSON's: the
    language of the schema's compact JSON texts, keys in the schema's order."""
    import json

    from outlines_core import json_schema as oc

    regex = oc.build_regex_from_schema(
        json.dumps(schema, ensure_ascii=False), whitespace_pattern=""
    )
    outlines_exponent = "([eE][+-][0-9]+)?"
    for theirs, ours in ((oc.STRING_INNER, RFC_STRING_CHAR), (outlines_exponent, RFC_EXPONENT)):
        regex = regex.replace(theirs, ours)
    if oc.STRING_INNER in regex or outlines_exponent in regex:
        raise AssertionError("the oracle's substitution failed")  # pragma: no cover
    return regex


def regex_difference(a: str, b: str) -> str | None:
    """A shortest text that `a` fullmatches and `b` does not (interegular's automata, compared
    exactly), or None when every text `a` matches, `b` matches too. A character that neither
    regex names is shown as `·`. Breadth first over the difference automaton's states, not its
    strings: the search visits each state once."""
    from collections import deque

    from interegular import parse_pattern
    from interegular.fsm import anything_else

    diff = parse_pattern(a).to_fsm().difference(parse_pattern(b).to_fsm())
    chars = {key: sorted(cs, key=lambda c: (c is anything_else, str(c)))[0]
             for key, cs in diff.alphabet.by_transition.items()}  # fmt: skip
    came_from = {diff.initial: None}
    todo = deque([diff.initial])
    while todo:
        state = todo.popleft()
        if state in diff.finals:
            text = []
            while came_from[state] is not None:
                state, char = came_from[state]
                text.append("·" if char is anything_else else char)
            return "".join(reversed(text))
        for key, target in diff.map.get(state, {}).items():
            if target not in came_from:
                came_from[target] = (state, chars[key])
                todo.append(target)
    return None
