"""Chapter 8, "Serving it": the OutputProcessor, graded against the tokenizer's own `decode` of
every token (HF's tokenizers, not the course's code) cut at the first stop string by Python's
`str.find`, on the engine's outputs for texts whose characters span tokens and whose stop
strings begin in one token and end in another."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

CHAPTER = "08_serving"

# Every character of the accented and curly-quoted words spans two tokens of the shipped
# tokenizer, the emoji four; "soft, what" spans three tokens, and so does "\n\nEnter".
TEXT = "ROMEO. But soft, what light through yonder window breaks?\n\nEnter JULIET above."
SPLIT = "Caf\u00e9 na\u00efve \u2014 \u201cso\u201d \U0001f642 \u2019tis done, and so farewell."
REASONS = ("stop", "length", "abort", "error")


@pytest.fixture(scope="module")
def tokenizer(shipped):
    return shipped[1]


def decode(tokenizer, ids: list[int]) -> str:
    """The oracle: the tokenizer's own decoding of the tokens, end-of-text left out."""
    return tokenizer.decode(ids, skip_special_tokens=True)


def engine_outputs(impl, rid: str, ids: list[int], chunks: list[int], reason: str = "length",
                   error: str | None = None) -> list:  # fmt: skip
    """The engine's outputs for one request, as `LLMEngine.step` reports them: `chunks[k]` new
    tokens in step k (0: a step that read a prompt chunk and sampled nothing); finished in the
    last step, with `reason`."""
    assert sum(chunks) == len(ids)
    outputs, done = [], 0
    for k, n in enumerate(chunks):
        last = k == len(chunks) - 1
        outputs.append(impl.RequestOutput(
            request_id=rid, new_token_ids=ids[done : done + n], output_token_ids=ids[: done + n],
            finished=last, finish_reason=reason if last else None, error=error if last else None,
        ))  # fmt: skip
        done += n
    return outputs


def one_by_one(n: int) -> list[int]:
    return [0] + [1] * n  # a prefill step, then a token a step


@dataclass
class Step:
    """What one `process_outputs` call gave: its deltas (request id -> (text, num_output_tokens,
    reason, error)), its to_abort list, the ids the processor still knows, and, for messages
    only, each known request's `state.text` and `state.sent` (the fields the exercise's given
    RequestState documents; a solution may keep its own and still pass every test)."""

    deltas: dict
    to_abort: list
    known: set
    state: dict


def run(impl, tokenizer, steps: list[list], stops: dict[str, tuple[str, ...]]) -> list[Step]:
    """Feed the processor one list of outputs per step; return what each step gave."""
    processor = impl.OutputProcessor(tokenizer)
    for rid, stop in stops.items():
        processor.add_request(rid, stop)
    trace = []
    for outputs in steps:
        try:
            processed = processor.process_outputs(outputs)
        except ValueError as error:
            if not any(s == () for s in stops.values()) or "empty" not in str(error):
                raise
            raise AssertionError(
                f"process_outputs raised ValueError ({error}) for a request with no stop strings "
                "(stop=()): the longest of no stop strings has no length. With no stop strings, "
                "nothing is held back: the hold is 0 (a max over an empty list needs a default)."
            ) from None
        deltas = {rid: (d.text, d.num_output_tokens, d.finish_reason, d.error)
                  for rid, d in processed.deltas.items()}  # fmt: skip
        known = processor.states if isinstance(processor.states, dict) else {}
        state = {rid: (getattr(st, "text", None), getattr(st, "sent", None))
                 for rid, st in known.items()}  # fmt: skip
        trace.append(Step(deltas, list(processed.to_abort), set(processor.states), state))
    return trace


def sent(trace: list[Step], rid: str) -> list[str]:
    """The text the client has after each step."""
    out, text = [], ""
    for step in trace:
        if rid in step.deltas:
            text += step.deltas[rid][0]
        out.append(text)
    return out


def reasons(trace: list[Step], rid: str) -> list:
    return [step.deltas[rid][2] for step in trace if rid in step.deltas]


def stepwise(outputs: list) -> list[list]:
    return [[o] for o in outputs]


def sent_never_moved(trace: list[Step], rid: str) -> bool:
    """Whether the request's state.sent stayed at 0 while deltas carried text."""
    marks = [step.state[rid][1] for step in trace if rid in step.state]
    return any(step.deltas.get(rid, ("",))[0] for step in trace) and set(marks) == {0}


def text_grew_too_much(trace: list[Step], rid: str, texts: list[str]):
    """The first step after which state.text is longer than the text so far (the oracle's
    `texts[k]`), as (step, its length, the right length); None if there is none."""
    for k, step in enumerate(trace):
        text = step.state.get(rid, (None, None))[0]
        if isinstance(text, str) and len(text) > len(texts[k]):
            return k, len(text), len(texts[k])
    return None


def shortened(text: str, most: int = 160) -> str:
    return repr(text) if len(text) <= most else repr(text[:most]) + f"… ({len(text)} characters)"


def lost_text(trace: list[Step], rid: str, texts: list[str], got: str, want: str) -> str:
    """Why the client got less than the whole text (no stop strings): `texts[k]` is the text so
    far after step k, by the oracle."""
    if got == "":
        return (" No text reached the client at all, not even with the last delta: a delta's "
                "text runs from state.sent to the end chosen for this step; is state.sent moved "
                "to that end before the delta's text is read?")  # fmt: skip
    if got == "".join(c for c in want if ord(c) < 128) != want:
        return (" Every character that spans several tokens is missing: the detokenizer keeps a "
                "character's first tokens until its last one comes, so a request needs the same "
                "detokenizer at every step (its state's), not a new one each step.")  # fmt: skip
    for k, step in enumerate(trace):
        text, at = step.state.get(rid, (None, None))
        if isinstance(text, str) and text and text != texts[k]:
            return (f" After step {k}, state.text held {text!r}, but the text so far is "
                    f"{texts[k]!r}: state.text keeps all the text so far, each step's new text "
                    "added to it, not put in its place.")  # fmt: skip
        if isinstance(text, str) and isinstance(at, int) and at > len(text):
            return (f" After step {k}, state.sent was {at}, past the end of the text "
                    f"({len(text)} characters): the next delta starts after characters that "
                    "were never sent. The end of what a step sends is at most the text's "
                    "length; with no stop strings, nothing is held back (0 characters, not "
                    "-1).")  # fmt: skip
    return (
        f" {len(want) - len(got)} characters never reached the client: each delta starts "
        "where the last one ended (state.sent) and the last one sends all that is left."
    )


# ------------------------------------------------------------------------- text, no stop


@pytest.mark.output_processor
@pytest.mark.parametrize("text", [TEXT, SPLIT], ids=["ascii", "split-characters"])
def test_with_no_stop_strings_each_step_sends_all_the_whole_characters_so_far(impl, tokenizer,
                                                                              text):  # fmt: skip
    ids = tokenizer.encode(text)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": ()})
    got, want = sent(trace, "a"), decode(tokenizer, ids)
    texts = [decode(tokenizer, ids[: max(k, 0)]) for k in range(len(trace))]
    if "\ufffd" in got[-1]:
        hint = (" A piece of a character (U+FFFD) was sent: while the text ends inside a "
                "character, the detokenizer must wait for its next token (last=True only once "
                "the engine has finished the request).")  # fmt: skip
    elif len(got[-1]) > len(want) and sent_never_moved(trace, "a"):
        hint = (" Text was sent more than once: a delta carries only the text not sent before, "
                "but state.sent stayed at 0 after every step, though text was sent, so each "
                "delta starts again from the beginning. After a delta is made, state.sent moves "
                "to the end of what it sent.")  # fmt: skip
    elif len(got[-1]) > len(want) and (grew := text_grew_too_much(trace, "a", texts)):
        k, length, right = grew
        hint = (" Text was sent more than once: state.text grew by more than the step's new "
                f"text (after step {k}, it is {length} characters, the text so far {right}). Is "
                "the detokenizer handed every token so far, where it takes only the step's new "
                "tokens (output.new_token_ids)?")  # fmt: skip
    elif len(got[-1]) > len(want):
        hint = (" Text was sent more than once: a delta carries only the text not sent before "
                "(from state.sent on), and `detokenizer.add` takes the step's new tokens "
                "(output.new_token_ids), not every token so far.")  # fmt: skip
    elif len(got[-1]) < len(want):
        hint = lost_text(trace, "a", texts, got[-1], want)
    else:
        hint = ""
    # The diagnosis first: the texts compared can run to a thousand characters.
    assert got[-1] == want, (
        hint.lstrip() + (" " if hint else "")
        + "The text sent, all deltas joined, should be the tokenizer's decoding of every token: "
        f"expected {shortened(want)}, got {shortened(got[-1])}."
    )  # fmt: skip
    for k in range(1, len(ids) + 1):
        whole = decode(tokenizer, ids[:k])
        if whole.endswith("\ufffd"):  # the last character is not whole yet
            assert "\ufffd" not in got[k], (
                f"after {k} tokens the client got {got[k]!r}: a piece of a character (U+FFFD) "
                "was sent. A character split over tokens waits for its last token: that is "
                "what the detokenizer's empty answer means; send nothing then."
            )
        elif got[k] == "":
            raise AssertionError(
                f"with no stop strings, nothing needs holding back: after {k} tokens the client "
                f"should have {whole!r}, got nothing at all yet. Is the end of what a step sends "
                "the larger of state.sent and the text's length less the hold (0 here), or the "
                "smaller?"
            )
        else:
            assert got[k] == whole, (
                f"with no stop strings, nothing needs holding back: after {k} tokens the client "
                f"should have {whole!r}, got {got[k]!r}."
                + (" Text was held back although no stop string could begin in it (with no stop "
                   "strings, hold back 0 characters)." if whole.startswith(got[k]) else "")
            )  # fmt: skip
    said = reasons(trace, "a")
    errors = [step.deltas["a"][3] for step in trace if "a" in step.deltas]
    assert said == [None] * (len(said) - 1) + ["length"], (
        f"only the last delta says why the request finished (the engine's reason, 'length' "
        f"here); the deltas' reasons were {said}."
        + (f" The reason came in the error field ({errors[-1]!r}): a Delta's fields are, in "
           "order, text, num_output_tokens, finish_reason, error." if errors[-1] in REASONS
           else "")
    )  # fmt: skip


@pytest.mark.output_processor
def test_a_step_with_nothing_to_send_makes_no_delta(impl, tokenizer):
    ids = tokenizer.encode(SPLIT)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": ()})
    empty = [k for k, step in enumerate(trace) if "a" in step.deltas
             and step.deltas["a"][0] == "" and step.deltas["a"][2] is None]  # fmt: skip
    assert not empty, (
        f"steps {empty} made a delta with no text and no reason (a prefill step, or a token that "
        f"ended inside a character): a request with nothing to send gets no delta in that step."
    )


@pytest.mark.output_processor
def test_a_delta_counts_every_token_written_so_far(impl, tokenizer):
    ids = tokenizer.encode(TEXT)
    chunks = [0, 3, 1, 4, 2] + [1] * (len(ids) - 10)
    trace = run(impl, tokenizer, stepwise(engine_outputs(impl, "a", ids, chunks)), {"a": ()})
    written = [sum(chunks[: k + 1]) for k in range(len(chunks))]
    chars = sent(trace, "a")
    for k, step in enumerate(trace):
        if "a" in step.deltas:
            says = step.deltas["a"][1]
            assert says == written[k], (
                f"after step {k} the request had written {written[k]} tokens, but its delta "
                f"says {says}: num_output_tokens counts every token so far (all the output "
                f"tokens the request has written)"
                + (", not this step's." if says == chunks[k] else
                   f", not the characters of text ({len(chars[k])} so far)."
                   if says in (len(chars[k]), len(decode(tokenizer, ids[: written[k]])))
                   else ".")
            )  # fmt: skip


@pytest.mark.output_processor
def test_requests_in_one_step_each_get_their_own_text(impl, tokenizer):
    a, b = tokenizer.encode(TEXT), tokenizer.encode(SPLIT)
    rng, ca = random.Random(0), [0]
    while sum(ca) < len(a):  # a few tokens a step, as after a speculative step
        ca.append(min(rng.randint(1, 3), len(a) - sum(ca)))
    cb = [1] * len(b)
    oa, ob = engine_outputs(impl, "a", a, ca), engine_outputs(impl, "b", b, cb)
    steps = [[*oa[k : k + 1], *ob[k : k + 1]] for k in range(max(len(oa), len(ob)))]
    trace = run(impl, tokenizer, steps, {"a": (), "b": ()})
    right = {
        rid: sent(trace, rid)[-1] == decode(tokenizer, ids) for rid, ids in (("a", a), ("b", b))
    }
    both = [k for k in range(len(trace)) if len(steps[k]) == 2
            and all(o.new_token_ids for o in steps[k])]  # fmt: skip
    assert len(both) < 3 or any(len(trace[k].deltas) == 2 for k in both), (
        f"in none of the {len(both)} steps where both requests brought new tokens do the "
        "step's deltas hold both requests: one request's delta took the place of the other's. "
        "Is processed.deltas made anew for each output (a new dict assigned) rather than "
        "added to, one entry per request?"
    )
    for rid, ids in (("a", a), ("b", b)):
        assert right[rid], (
            f"two requests advanced in the same steps; request {rid!r} got "
            f"{sent(trace, rid)[-1]!r}, expected {decode(tokenizer, ids)!r}."
            + (" Request 'b', one new token a step, got its text right; request 'a''s steps "
               f"brought {sorted(set(ca))} new tokens each (the prefill step none): does each "
               "step add all of its new tokens (output.new_token_ids), and none when it brings "
               "none?" if rid == "a" and right["b"]
               else " Each request's text is its own (its own state, its own detokenizer).")
        )  # fmt: skip


# -------------------------------------------------------------------------- stop strings


def stop_case(tokenizer, stop: tuple[str, ...], text: str = TEXT):
    ids = tokenizer.encode(text)
    hits = [text.find(s) for s in stop if s in text]
    want = text[: min(hits)] if hits else text
    return ids, want


def no_early_end(trace: list[Step], tokenizer, ids: list[int], stop: tuple[str, ...],
                 until: int) -> None:  # fmt: skip
    """Before step `until` (one token a step) no stop string is in the text: no step may end
    the request or ask for its abort."""
    for j, step in enumerate(trace[:until]):
        reason = step.deltas.get("a", (None,) * 4)[2]
        if reason is not None or "a" in step.to_abort:
            raise AssertionError(
                f"after {j} tokens the text is {decode(tokenizer, ids[:j])!r}, with none of the "
                f"stop strings {stop} in it, yet the request "
                + (f"finished with {reason!r}" if reason is not None else "was named in to_abort")
                + ". A stop string that does not occur is not found: str.find answers -1 then, "
                "and -1 is not a place in the text."
            )


@pytest.mark.output_processor
def test_text_is_held_back_exactly_as_long_as_a_stop_string_could_begin_in_it(impl, tokenizer):
    # Never in the text. The longest is 5 characters (7 bytes in UTF-8): hold back 4 characters.
    stop = ("zzz", "qq\u2014qq")
    ids = tokenizer.encode(TEXT)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    no_early_end(trace, tokenizer, ids, stop, len(ids))
    got = sent(trace, "a")
    wholes = [decode(tokenizer, ids[:k]) for k in range(len(ids) + 1)]
    wants = [w[: max(0, len(w) - 4)] for w in wholes]
    wrong = [k for k in range(1, len(ids)) if got[k] != wants[k]]

    def head(k: int) -> str:
        held = len(wholes[k]) - len(got[k])
        return (
            f"stop strings {stop}: after {k} tokens the text is {wholes[k]!r}, and a stop string "
            f"could begin in its last 4 characters only (the longest, {stop[1]!r}, has 5 "
            f"characters, less one), so the client should have {wants[k]!r}, got {got[k]!r}: "
            f"{held} character{'s' * (held != 1)} held back."
        )

    if wrong:
        k = wrong[0]
        held = len(wholes[k]) - len(got[k])
        if not wholes[k].startswith(got[k]):
            raise AssertionError(
                head(k) + " Text already sent was sent again, or out of order: the end of what a "
                "delta sends is never below state.sent (nor negative, while the text is shorter "
                "than the hold)."
            )
        if held < 4:
            raise AssertionError(
                head(k) + " That is too little held back: a stop string can begin in one token "
                "and end in a later one, so text past its beginning would be sent before the "
                "stop string was complete."
                + (" 2 is the length of 'zzz' less one: the hold comes from the longest stop "
                   "string (by its length)." if held == 2 else "")
            )  # fmt: skip
        at = trace[k].state.get("a", (None, None))[1]
        if isinstance(at, int) and at != len(got[k]):
            raise AssertionError(
                head(k) + f" state.sent says {at} characters were sent, but the client has "
                f"{len(got[k])}: characters held back in one step must go out in a later one, "
                "once the text has grown past them; state.sent is the end of what was sent, not "
                "the text's length."
            )
        # A step whose text is long enough not to cut the hold short shows how much is held.
        k = next((j for j in wrong if len(wholes[j]) > 8), k)
        held = len(wholes[k]) - len(got[k])
        raise AssertionError(
            head(k) + " That holds back too much."
            + (" 5 is the longest stop string's whole length: a stop string beginning 5 "
               "characters from the end would already be complete." if held == 5 else "")
            + (" 6 is the longest stop string's length in bytes (7) less one: the hold counts "
               "characters of the text (len of a str), not bytes." if held == 6 else "")
        )  # fmt: skip
    assert got[-1] == decode(tokenizer, ids) and reasons(trace, "a")[-1] == "length", (
        f"when the request finishes, the held-back characters are sent with its last delta: "
        f"expected {decode(tokenizer, ids)!r} and reason 'length', got {got[-1]!r} and "
        f"{reasons(trace, 'a')[-1]!r}."
    )
    assert not any(step.to_abort for step in trace), (
        "no stop string occurs in the text, yet to_abort named the request."
    )


def past_stop(text: str, want: str, stop: tuple[str, ...], whole: bool, found: bool) -> str:
    """Why `text` (what the client has after a step) is not a beginning of `want`; `whole`: the
    stop string is complete in the text after that step; `found`: that step said 'stop'."""
    if any(s in text for s in stop):
        return (" The stop string itself was sent: the text ends before it (OpenAI's API leaves "
                "the stop string out).")  # fmt: skip
    if len(text) > len(want) and whole and found:
        return (" The stop string was found in this step, but the text sent runs past its "
                "beginning: the text ends where the stop string begins (the index str.find "
                "gives), so that none of it is sent.")  # fmt: skip
    if len(text) > len(want) and whole:
        return (" The stop string was complete in the text after this step's tokens, but was "
                "not found: it began in an earlier step's tokens, so it is looked for in all "
                "the text so far, once the step's new text is added, not in the step's new text "
                "alone.")  # fmt: skip
    if len(text) > len(want):
        return (" Text past the stop string's beginning was sent before the stop string was "
                "complete: a stop string can begin in one token and end in a later one, so the "
                "last len(longest stop string) - 1 characters wait until it is known that none "
                "begins there.")  # fmt: skip
    return (" Text already sent was sent again, or out of order: the end of what a delta sends "
            "is never below state.sent (nor negative, while the text is shorter than the "
            "hold).")  # fmt: skip


@pytest.mark.output_processor
@pytest.mark.parametrize("stop", [("soft, what",), ("\n\nEnter",), ("yonder", "light")],
                         ids=["spans-three-tokens", "newlines", "earliest-of-two"])  # fmt: skip
def test_nothing_is_sent_past_a_stop_string_and_the_request_is_aborted(impl, tokenizer, stop):
    ids, want = stop_case(tokenizer, stop)
    outputs = engine_outputs(impl, "a", ids, one_by_one(len(ids)))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    got = sent(trace, "a")
    # Step k has read k tokens (step 0 a prompt chunk); the stop string is whole at step `k`.
    k = next(k for k in range(len(ids)) if any(s in decode(tokenizer, ids[:k]) for s in stop))
    no_early_end(trace, tokenizer, ids, stop, k)
    last = trace[k].deltas.get("a")
    for j, text in enumerate(got[: k + 1]):
        assert want.startswith(text), (
            f"after {j} tokens the client had {text!r}, which is not a beginning of the answer "
            f"{want!r} (the text up to the first stop string of {stop})."
            + past_stop(text, want, stop, j == k, j == k and last is not None
                        and last[2] == "stop")
        )  # fmt: skip
    assert last is not None and last[2] == "stop", (
        f"the stop string is complete after {k} tokens: that step's delta ends the request with "
        f"reason 'stop' (the engine has not finished it); its delta was {last}."
        + (
            " Your processor found the stop string (it cut the text and asked for the abort), "
            "yet the delta says None: that is the engine's finish_reason, None while the "
            "engine runs the request. The delta carries the reason the processor decided."
            if last is not None and last[2] is None and "a" in trace[k].to_abort
            else ""
        )
    )
    forgotten_at_engines_end = False
    if "a" in trace[k].known:  # kept: is a request the engine finishes forgotten?
        ended = run(impl, tokenizer, stepwise(engine_outputs(impl, "a", ids[:3], one_by_one(3))),
                    {"a": stop})  # fmt: skip
        forgotten_at_engines_end = "a" not in ended[-1].known
    assert "a" not in trace[k].known, (
        "after its last delta a request must be forgotten (removed from self.states): the "
        "engine's next step reports its abort, which must make no second last delta."
        + (
            " A request the ENGINE finishes is forgotten; this one met its stop string while "
            "the engine had not finished it (output.finished is False): whether to hold text "
            "back or finish is decided by the reason, which a stop string sets too, not by the "
            "engine's finished flag."
            if forgotten_at_engines_end
            else ""
        )
    )
    short = len(want) - len(got[-1])
    assert got[-1] == want, (
        f"the request's text should end just before its first stop string: expected {want!r}, "
        f"got {got[-1]!r}."
        + (" One character short: the text ends at the index where the stop string begins "
           "(str.find's answer), not one before." if short == 1 and want.startswith(got[-1])
           else f" The last {short} characters before the stop string never reached the "
           "client: a request that met a stop string sends all that is left before it, nothing "
           "held back, and the stop string's place is its index in all the text so far, not "
           "in a part of it." if short > 1 and want.startswith(got[-1])
           else " With several stop strings, the text ends at the one that occurs first in "
           "the text, not the first in the list." if len(stop) > 1 else "")
    )  # fmt: skip
    odd = [x for step in trace for x in step.to_abort if not isinstance(x, str)]
    assert not odd, (
        f"to_abort holds request ids (strings), the ids the loop hands to the engine's abort; it "
        f"held a {type(odd[0]).__name__}."
    )
    aborts = [j for j, step in enumerate(trace) if "a" in step.to_abort]
    assert aborts == [k], (
        f"the stop string was complete at step {k}, while the engine was still running the "
        f"request: that step's to_abort must name it (once), so that the loop ends it in the "
        f"engine; it was named at steps {aborts}."
    )


@pytest.mark.output_processor
def test_an_answer_that_begins_with_a_stop_string_is_empty(impl, tokenizer):
    """The first step after the prompt brings four tokens, "ROMEO": the stop string is whole in
    that step's new text, at index 0."""
    stop = ("ROMEO",)
    ids = tokenizer.encode(TEXT)
    assert decode(tokenizer, ids[:4]) == "ROMEO"
    outputs = engine_outputs(impl, "a", ids, [0, 4] + [1] * (len(ids) - 4))
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    assert sent(trace, "a")[1] == "", (
        f"the answer begins with its stop string {stop[0]!r}: nothing may be sent, got "
        f"{sent(trace, 'a')[1]!r} after the step that brought it. str.find answers 0 for a stop "
        "string at the very beginning: 0 is a place in the text (only -1 means absent)."
    )
    assert trace[1].deltas.get("a") == ("", 4, "stop", None), (
        f"the stop string is complete after 4 tokens: that step's delta has no text, and still "
        f"ends the request with 'stop' (a delta is made for a reason to give, even with nothing "
        f"to send); its delta was {trace[1].deltas.get('a')}."
    )
    assert trace[1].to_abort == ["a"], (
        f"the engine was still running the request: to_abort should be ['a'], got "
        f"{trace[1].to_abort}."
    )


@pytest.mark.output_processor
@pytest.mark.parametrize("stop", [("soft",), ("light", "soft", "yonder"), (" w",)],
                         ids=["one", "earliest-of-three", "twice"])  # fmt: skip
def test_the_stop_string_is_found_anywhere_in_a_steps_new_text(impl, tokenizer, stop):
    """A step may bring several tokens (after a prefill, or a speculative step): the stop string
    may be whole inside them, with text after it, another stop string after that, or the same
    stop string twice."""
    ids, want = stop_case(tokenizer, stop)
    n = 16  # to "window": "soft", " what", "light", "yonder", " window"
    outputs = engine_outputs(impl, "a", ids, [0, n, len(ids) - n])
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    text, got = decode(tokenizer, ids[:n]), sent(trace, "a")[1]
    finds = sorted(text.find(s) for s in stop)
    if got == want and reasons(trace, "a") == ["stop"]:
        hint = ""
    elif len(stop) > 1 and got == text[: text.find(stop[0])]:
        hint = (" The text ends at the stop string that occurs first in the text, not the first "
                "of the list.")  # fmt: skip
    elif len(stop) > 1 and got == text[: finds[-1]]:
        hint = (" The text ended at the stop string that occurs last: it ends at the one that "
                "occurs first in the text (the smallest index found).")  # fmt: skip
    elif len(stop) == 1 and text.count(stop[0]) > 1 and got == text[: text.rfind(stop[0])]:
        hint = (f" {stop[0]!r} occurs twice in the step's text: the text ends at the first "
                "place it occurs (str.find), not the last (str.rfind).")  # fmt: skip
    else:
        hint = ""
    assert got == want and reasons(trace, "a") == ["stop"], (
        f"the step's {n} new tokens hold the stop strings {stop} and text after them: that "
        f"step's delta should be {want!r} with reason 'stop', got {trace[1].deltas.get('a')}."
        + hint
    )
    assert trace[1].to_abort == ["a"], (
        f"the engine was still running the request: to_abort should be ['a'], got "
        f"{trace[1].to_abort}."
        + (" A request is named once, however many of its stop strings occur."
           if trace[1].to_abort.count("a") > 1 else "")
    )  # fmt: skip


@pytest.mark.output_processor
def test_requests_that_stop_in_one_step_leave_the_others_going(impl, tokenizer):
    """Three requests in every step: two meet their stop strings in the same step, the third
    (listed after them) goes on. Their ids are the server's kind, several characters long."""
    ids, other = tokenizer.encode(TEXT), tokenizer.encode(SPLIT)
    a, b, c = "cmpl-a", "cmpl-b", "cmpl-c"
    stops = {a: ("soft",), b: ("But soft",), c: ()}
    k = next(k for k in range(len(ids)) if "soft" in decode(tokenizer, ids[:k]))
    outs = {a: engine_outputs(impl, a, ids, one_by_one(len(ids))),
            b: engine_outputs(impl, b, ids, one_by_one(len(ids))),
            c: engine_outputs(impl, c, other, one_by_one(len(other)))}  # fmt: skip
    steps = [[o[j] for o in outs.values() if j < len(o)] for j in range(len(other) + 1)]
    trace = run(impl, tokenizer, steps, stops)
    assert not decode(tokenizer, other[:k]).endswith("\ufffd")  # c has text to send at k
    missing = [rid for rid in (b, c) if rid not in trace[k].deltas]
    assert not missing, (
        f"after {k} tokens request {a!r} met its stop string; the same step's outputs of "
        f"{missing}, listed after it, got no delta ({b!r} met its own stop string, {c!r} had "
        "new text). Is the loop left (break, return) when a request meets a stop string, "
        "instead of going on with the step's next output?"
    )
    for rid in (a, b):
        last, (s,) = trace[k].deltas.get(rid), stops[rid]
        assert last is not None and last[2] == "stop", (
            f"request {rid!r}'s stop string {s!r} is complete after {k} tokens "
            f"({decode(tokenizer, ids[:k])!r}): that step's delta ends it with 'stop'; its delta "
            f"was {last}."
            + (" The stop string began in an earlier step's tokens: is it looked for in all the "
               "text so far, not in the step's new text alone?"
               if s not in decode(tokenizer, ids[k - 1 : k]) else "")
        )  # fmt: skip
    got = trace[k].to_abort
    assert sorted(got) == [a, b], (
        f"requests {a!r} and {b!r} both met their stop strings in step {k}: to_abort must name "
        f"both, got {got}."
        + (" Those are the characters of the ids: list.extend adds each item of what it is "
           "given, and a string's items are its characters; a list gains one id with append."
           if got and all(isinstance(x, str) and len(x) == 1 for x in got)
           else " Is the list replaced rather than added to?")
    )  # fmt: skip
    for rid, want in ((a, "ROMEO. But "), (b, "ROMEO. "), (c, decode(tokenizer, other))):
        assert sent(trace, rid)[-1] == want, (
            f"request {rid!r} should have {want!r} in all, got {sent(trace, rid)[-1]!r}: each "
            "request's text and stop strings are its own."
        )


@pytest.mark.output_processor
def test_a_stop_string_in_the_last_step_finishes_with_stop_and_aborts_nothing(impl, tokenizer):
    stop = ("yonder",)
    ids, want = stop_case(tokenizer, stop)
    cut = next(k for k in range(len(ids)) if "yonder" in decode(tokenizer, ids[:k]))
    outputs = engine_outputs(impl, "a", ids[:cut], one_by_one(cut), reason="length")
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    assert sent(trace, "a")[-1] == want and reasons(trace, "a")[-1] == "stop", (
        f"the engine finished the request ('length') in the step that completed a stop string: "
        f"the text still ends before it, with reason 'stop'; got {sent(trace, 'a')[-1]!r} and "
        f"{reasons(trace, 'a')[-1]!r}."
        + (" Is the stop string looked for in a step where the engine finishes the request too, "
           "and in all the text so far?" if reasons(trace, "a")[-1] != "stop" else "")
    )  # fmt: skip
    assert not any(step.to_abort for step in trace), (
        "the engine had already finished this request when its stop string came: there is "
        "nothing to abort (to_abort is for requests the engine still runs)."
    )


# ---------------------------------------------------------------------- the engine's ends


@pytest.mark.output_processor
@pytest.mark.parametrize("last_step", [3, 1], ids=["several-tokens", "one-token"])
def test_a_last_token_inside_a_character_is_still_sent(impl, tokenizer, last_step):
    """max_tokens can end a request in the middle of a character: its last delta has all that
    the tokenizer decodes, the replacement character included; the last step may bring whole
    characters too."""
    ids = tokenizer.encode(SPLIT)
    k = next(k for k in range(1, len(ids)) if decode(tokenizer, ids[:k]).endswith("\ufffd"))
    chunks = one_by_one(k - last_step) + [last_step]
    outputs = engine_outputs(impl, "a", ids[:k], chunks, reason="length")
    trace = run(impl, tokenizer, stepwise(outputs), {"a": ()})
    want, got = decode(tokenizer, ids[:k]), sent(trace, "a")[-1]
    assert got == want, (
        f"the request ended after {k} tokens, in the middle of a character: its last delta must "
        f"send what is left ({want!r} in all), got {got!r}."
        + (" The replacement character (U+FFFD) was taken out: a request that ends inside a "
           "character sends what the tokenizer decodes, U+FFFD included." if
           got == want.replace("\ufffd", "") and last_step > 1 else
           " The detokenizer gives the unfinished piece only when told it is the last call "
           "(last=True once the engine has finished the request).")
    )  # fmt: skip


@pytest.mark.output_processor
@pytest.mark.parametrize("reason, error", [("abort", None), ("error", "the pool is too small")])
def test_the_engines_own_end_is_passed_on_with_what_was_held(impl, tokenizer, reason, error):
    stop = ("qqq",)
    ids = tokenizer.encode(TEXT)[:12]
    outputs = engine_outputs(impl, "a", ids, one_by_one(12) + [0], reason=reason, error=error)
    trace = run(impl, tokenizer, stepwise(outputs), {"a": stop})
    last = trace[-1].deltas.get("a")
    assert last is not None and last[2:] == (reason, error), (
        f"the engine ended the request with {reason!r} ({error!r}) and no new token: the last "
        f"delta passes on its reason and error, got {last}."
    )
    assert sent(trace, "a")[-1] == decode(tokenizer, ids), (
        f"the characters held back for a possible stop string go with the last delta: expected "
        f"{decode(tokenizer, ids)!r} in all, got {sent(trace, 'a')[-1]!r}."
    )
    assert "a" not in trace[-1].known, "after its last delta, the request must be forgotten."
    assert not any(step.to_abort for step in trace), (
        "the engine ended this request itself: nothing to abort."
    )


@pytest.mark.output_processor
@pytest.mark.parametrize("split", [False, True], ids=["all-sent", "inside-a-character"])
def test_an_end_with_no_new_token_still_makes_the_last_delta(impl, tokenizer, split):
    """The engine aborts a request between two of its tokens: no stop strings, so all its text
    was sent, except a character whose first tokens came and whose last did not."""
    ids = tokenizer.encode(SPLIT)
    ends = [k for k in range(1, len(ids)) if decode(tokenizer, ids[:k]).endswith("\ufffd")]
    k = ends[0] if split else 10  # "Caf\u00e9 na\u00efve": whole characters
    assert split or k not in ends
    outputs = engine_outputs(impl, "a", ids[:k], one_by_one(k) + [0], reason="abort")
    trace = run(impl, tokenizer, stepwise(outputs), {"a": ()})
    last = trace[-1].deltas.get("a")
    assert last is not None and last[2] == "abort", (
        "the engine aborted the request in a step that brought no new token"
        + (" and left nothing to send" if not split else "")
        + ": its last delta still gives the reason 'abort'"
        + (" (with no text)" if not split else "")
        + f", got {last}. A delta is made when there is text to send or a reason to give."
    )  # fmt: skip
    want = decode(tokenizer, ids[:k])
    assert sent(trace, "a")[-1] == want, (
        f"the request ended inside a character: its last delta sends what is left ({want!r} in "
        f"all, U+FFFD included), got {sent(trace, 'a')[-1]!r}. The detokenizer still holds that "
        "character's first tokens: it is called (last=True) in the last step even when the step "
        "brought no new token."
    )


@pytest.mark.output_processor
def test_outputs_of_unknown_requests_are_ignored(impl, tokenizer):
    ids = tokenizer.encode(TEXT)[:5]
    step = engine_outputs(impl, "ghost", ids, [5]) + engine_outputs(impl, "a", ids, [5])
    trace = run(impl, tokenizer, [step], {"a": ()})
    assert set(trace[0].deltas) == {"a"} and trace[0].to_abort == [], (
        f"an output for a request the processor does not know (one already ended at a stop "
        f"string) makes no delta and no abort; the known one gets its delta. Got deltas for "
        f"{sorted(trace[0].deltas)} and to_abort {trace[0].to_abort}."
    )
