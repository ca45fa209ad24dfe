"""A regular expression as a DFA over BYTES: the automaton a token's bytes are walked through.

A regex speaks of characters; a byte-level tokenizer's tokens are bytes, and a token may end in
the middle of a character (`é` is the two bytes C3 A9, and this course's tokenizer has no token
holding both). So the constraint must be an automaton that reads one byte at a time.

interegular (a small pure-Python library) parses the regex into a DFA over characters. This
module turns it into one over bytes, reading each character as its UTF-8 encoding (1 to 4
bytes). A byte state is a character state plus what is pending of the character being read:

- nothing: the text so far ends on a character boundary;
- the first bytes of a character that could still be one the regex names (`é` after C3): which
  character it becomes decides where the regex goes, so those bytes are remembered;
- the remaining bytes of a character the regex does not name (a class such as `[^"]` takes every
  other character alike): only how many bytes are still to come and the range of the next one
  matter, so thousands of pending prefixes share one state. Without this merge a JSON string's
  automaton has one state per incomplete character, 17,674 for a two-field schema instead of 31.

Only states from which a final state can still be reached are kept: a byte with no entry in
`transitions[state]` leads nowhere (the dead state is never stored). The whole text must match,
as with `re.fullmatch`.

The regex subset is interegular's: literal characters (any Unicode), escapes, character classes
with ranges and negation, `.` (every character but a newline), `\\d \\w \\s` (ASCII only), groups,
alternation and repetition (`* + ? {m} {m,n}`). Anchors (`^`, `$`), back-references and Unicode
properties (`\\p{L}`) are refused with an error.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from interegular import parse_pattern
from interegular.fsm import anything_else


@dataclass(frozen=True)
class ByteDFA:
    """States are 0..n-1; `transitions[state][byte]` is the next state (missing: dead)."""

    initial: int
    finals: frozenset[int]
    transitions: list[dict[int, int]]

    def step(self, state: int, byte: int) -> int | None:
        return self.transitions[state].get(byte)

    def accepts(self, data: bytes) -> bool:
        """Whether `data` is a complete match (for tests and demos)."""
        state: int | None = self.initial
        for byte in data:
            state = self.step(state, byte)
            if state is None:
                return False
        return state in self.finals


# UTF-8: how many bytes a character has, read from its first byte (None: never a first byte;
# C0 and C1 would only start overlong encodings, F5-FF code points past U+10FFFF).
def utf8_length(lead: int) -> int | None:
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return None


# The second byte is narrower after four first bytes: E0 and F0 would otherwise start overlong
# encodings, ED a surrogate (U+D800-DFFF, not a character), F4 a code point past U+10FFFF.
SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
CONTINUATION = (0x80, 0xBF)


def next_byte_range(prefix: bytes) -> tuple[int, int]:
    return SECOND_BYTE.get(prefix[0], CONTINUATION) if len(prefix) == 1 else CONTINUATION


def code_point_range(prefix: bytes) -> tuple[int, int] | None:
    """The code points whose UTF-8 encoding starts with `prefix`, an incomplete character, as
    (lowest, highest); None if no character starts so. UTF-8 keeps the order of code points, so
    they are the range between the smallest and the largest completion."""
    n = utf8_length(prefix[0])
    if n is None or len(prefix) >= n:
        return None
    second = next_byte_range(prefix[:1])
    low = bytes(second[0] if i == 1 else 0x80 for i in range(len(prefix), n))
    high = bytes(second[1] if i == 1 else 0xBF for i in range(len(prefix), n))
    try:
        return ord((prefix + low).decode("utf-8")), ord((prefix + high).decode("utf-8"))
    except UnicodeDecodeError:  # a continuation byte out of its range
        return None


class CharDFA:
    """interegular's character DFA, reduced to the states that can still reach a final one."""

    def __init__(self, regex: str):
        fsm = parse_pattern(regex).to_fsm().reduce()
        self.fsm = fsm
        self.initial, self.finals = fsm.initial, set(fsm.finals)
        # The characters the regex names one by one, sorted by code point; every other
        # character shares the `anything_else` key (absent: no other character is allowed).
        self.named = sorted(ord(c) for c in fsm.alphabet if c is not anything_else)
        self.named_set = set(self.named)
        self.other_key = fsm.alphabet[anything_else] if anything_else in fsm.alphabet else None
        # Live states: those from which a final state can be reached (backwards from the finals).
        sources: dict[int, set[int]] = {}
        for state, row in fsm.map.items():
            for target in row.values():
                sources.setdefault(target, set()).add(state)
        self.live, todo = set(self.finals), list(self.finals)
        while todo:
            for state in sources.get(todo.pop(), ()):
                if state not in self.live:
                    self.live.add(state)
                    todo.append(state)

    def step(self, state: int, char: str) -> int | None:
        key = self.fsm.alphabet[char] if ord(char) in self.named_set else self.other_key
        target = self.fsm.map.get(state, {}).get(key) if key is not None else None
        return target if target in self.live else None

    def step_other(self, state: int) -> int | None:
        """Where any character the regex does not name leads."""
        target = self.fsm.map.get(state, {}).get(self.other_key)
        return target if self.other_key is not None and target in self.live else None

    def named_in(self, low: int, high: int) -> list[int]:
        return self.named[
            bisect.bisect_left(self.named, low) : bisect.bisect_right(self.named, high)
        ]

    def any_live(self, state: int, low: int, high: int) -> bool:
        """Does some character in [low, high] lead from `state` to a live state?"""
        named = self.named_in(low, high)
        if any(self.step(state, chr(cp)) is not None for cp in named):
            return True
        return len(named) < high - low + 1 and self.step_other(state) is not None


def regex_to_byte_dfa(regex: str) -> ByteDFA:
    """The byte-level DFA of `regex` (fullmatch semantics), every state live."""
    chars = CharDFA(regex)
    if chars.initial not in chars.live:
        raise ValueError(f"the regex {regex!r} matches no text at all")

    # A byte state's label: (character state, pending), pending one of
    #   b""                      on a character boundary,
    #   bytes                    the first bytes of a character the regex may name,
    #   ("rest", k, low, high)   k more bytes of an unnamed character, the next in [low, high];
    #                            the character state is already the one it leads to.
    def step(label, byte: int):
        state, pending = label
        if isinstance(pending, tuple):
            _, k, low, high = pending
            if not low <= byte <= high:
                return None
            return (state, b"") if k == 1 else (state, ("rest", k - 1, *CONTINUATION))
        prefix = pending + bytes([byte])
        n = utf8_length(prefix[0])
        if n is None:
            return None
        if len(prefix) == n:  # a whole character: step the character DFA on it
            try:
                char = prefix.decode("utf-8")  # strict: refuses surrogates and overlong forms
            except UnicodeDecodeError:
                return None
            target = chars.step(state, char)
            return None if target is None else (target, b"")
        span = code_point_range(prefix)
        if span is None:
            return None
        if not chars.named_in(*span):  # whatever character this becomes, the regex sees "other"
            target = chars.step_other(state)
            if target is None:
                return None
            return (target, ("rest", n - len(prefix), *next_byte_range(prefix)))
        return (state, prefix) if chars.any_live(state, *span) else None

    # Breadth first from the start, numbering states as they are found.
    start = (chars.initial, b"")
    number = {start: 0}
    transitions: list[dict[int, int]] = []
    finals = set()
    todo = deque([start])
    while todo:
        label = todo.popleft()
        row = {}
        for byte in range(256):
            target = step(label, byte)
            if target is None:
                continue
            if target not in number:
                number[target] = len(number)
                todo.append(target)
            row[byte] = number[target]
        transitions.append(row)
        if label[1] == b"" and label[0] in chars.finals:
            finals.add(number[label])
    return ByteDFA(initial=0, finals=frozenset(finals), transitions=transitions)
