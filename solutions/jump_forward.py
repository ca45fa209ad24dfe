"""Forced text: what a constraint allows as the only way on (SGLang's jump-forward, after its
"compressed finite state machine": Zheng et al., 2024, "SGLang: Efficient Execution of
Structured Language Model Programs", arXiv:2312.07104, and the LMSYS blog post "Fast JSON
Decoding for Local LLMs with Compressed Finite State Machine", February 2024).

Much of a JSON answer is not the model's choice: after `{` the schema allows only `"speaker":"`.
Where the automaton has exactly one way on, byte after byte, those bytes are **forced**: the
engine can append them without asking the model, and compute all their tokens in one forward
pass with the next step's token, as a prompt chunk is computed. Two forms (the engine's
`jump_forward`): "exact" appends a token only where it is the one token allowed (token-by-token
decoding would have drawn it with probability 1, so nothing changes but the model calls);
"text" appends the forced text tokenized as the tokenizer writes it, which saves more calls
but picks one tokenization of that text where the model might have drawn another, and so
changes what follows.
"""

from __future__ import annotations

from solutions.byte_dfa import ByteDFA


def whole_characters(data: bytes) -> str:
    """The longest start of `data` made of whole UTF-8 characters: "" when `data` begins inside
    a character (the last token ended in the middle of one), and a last character cut short is
    left out."""
    for end in range(len(data), 0, -1):
        try:
            return data[:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


def forced_text(dfa: ByteDFA, state: int) -> str:
    """The text the DFA allows as the only continuation from `state`: bytes read while the
    state is not final (the text may not stop there) and has exactly one byte's transition,
    kept up to the last whole character (`whole_characters`)."""
    # BEGIN SOLUTION
    data = bytearray()
    while state not in dfa.finals and len(dfa.transitions[state]) == 1:
        ((byte, state),) = dfa.transitions[state].items()
        data.append(byte)
    return whole_characters(bytes(data))
    # END SOLUTION
