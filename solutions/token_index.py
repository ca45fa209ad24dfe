"""The token index: for each state of the constraint's byte DFA, the tokens allowed there.

The constraint lives on bytes; the model speaks tokens. A token is allowed in a state when its
bytes walk through the DFA from that state without dying, and it leads to the state where the
walk ends. Walking all 4,096 tokens at every decoding step would cost milliseconds per token;
walking them once per state, ahead of time, turns each step's question into a dictionary
lookup. That is outlines' index (Willard & Louf, 2023, "Efficient Guided Generation for Large
Language Models", arXiv:2307.09702), which outlines-core, vLLM and SGLang use.

Every tokenization of the text is allowed, not only the tokenizer's own: `Romeo` may come as one
token or as `Rome` + `o` or five single letters, and the model may prefer any of them. The
end-of-text token adds no bytes; it is allowed exactly where the text so far is a complete
match (a final state), and it leaves the state where it is.
"""

from __future__ import annotations

from solutions.byte_dfa import ByteDFA


def walk(dfa: ByteDFA, state: int, data: bytes) -> int | None:
    """The state reached from `state` by reading `data` byte by byte, or None if the walk dies
    (some byte has no transition: no text that starts so can match)."""
    # BEGIN SOLUTION
    for byte in data:
        state = dfa.step(state, byte)
        if state is None:
            return None
    return state
    # END SOLUTION


class TokenIndex:
    """`transitions[state]` maps each token allowed in `state` to the state it leads to."""

    def __init__(self, dfa: ByteDFA, token_bytes: list[bytes | None], eos_id: int):
        self.dfa, self.eos_id = dfa, eos_id
        self.initial = dfa.initial
        self.transitions: list[dict[int, int]] = []
        # BEGIN SOLUTION
        for state in range(len(dfa.transitions)):
            row = {}
            for token, data in enumerate(token_bytes):
                if data is None:  # a special token is not text: only end-of-text, below
                    continue
                end = walk(dfa, state, data)
                if end is not None:
                    row[token] = end
            if state in dfa.finals:  # the text may stop here: end-of-text, going nowhere
                row[eos_id] = state
            self.transitions.append(row)
        # END SOLUTION

    def allowed(self, state: int) -> list[int]:
        """The token ids allowed in `state`."""
        # BEGIN SOLUTION
        return list(self.transitions[state])
        # END SOLUTION

    def advance(self, state: int, token: int) -> int:
        """The state after `token`, which must be allowed in `state`."""
        # next_state: where `token` leads from `state`, or None where it is not allowed.
        # BEGIN SOLUTION
        next_state = self.transitions[state].get(token)
        # END SOLUTION
        if next_state is None:
            raise ValueError(f"token {token} is not allowed in state {state}")
        return next_state

    def is_final(self, state: int) -> bool:
        """Whether the text that reached `state` is a complete match."""
        return state in self.dfa.finals


class Guide:
    """One request's place in its constraint: the state its generated text has reached. The
    index is shared by every request with the same constraint; each request has its own guide."""

    def __init__(self, index: TokenIndex):
        self.index = index
        self.state = index.initial

    def allowed(self) -> list[int]:
        return self.index.allowed(self.state)

    def advance(self, token: int) -> None:
        """Move past `token`, a token the request has just accepted."""
        self.state = self.index.advance(self.state, token)

    def is_finished(self) -> bool:
        """Whether the text so far is a complete match (end-of-text is allowed)."""
        return self.index.is_final(self.state)
