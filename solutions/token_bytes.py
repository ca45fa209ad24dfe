"""Tokens as byte strings: what each token id adds to the text, exactly.

A constraint on the text is a constraint on its bytes, so the first thing constrained decoding
needs is, for every token id, the bytes that token appends. For a byte-level BPE (GPT-2's, and
this course's) they are NOT what `tokenizer.decode([id])` returns:

- a token may hold part of a character: `é` is the bytes C3 A9, and this course's tokenizer
  spells it with two tokens, neither of which is a character alone (`decode` of one of them
  gives the replacement character U+FFFD, three bytes that were never in the text);
- the vocabulary stores each byte as a printable stand-in character (GPT-2's trick, so that the
  BPE merges work on strings): a space is `Ġ`, a newline `Ċ`. The token string `Ġthe` is the
  four bytes ` the`, not the UTF-8 encoding of `Ġthe` (C4 A0 74 68 65);
- special tokens (`<|endoftext|>`) are not text at all: they add no bytes.
"""

from __future__ import annotations


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's map from each byte (0..255) to the character that stands for it in the
    vocabulary's token strings. The 188 printable Latin-1 bytes stand for themselves; the other
    68 (controls, space, DEL, no-break space, soft hyphen ...) are moved to 256, 257, ... in
    byte order, so that every token string is printable and contains no whitespace."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    alphabet = {byte: chr(byte) for byte in printable}
    moved = [byte for byte in range(256) if byte not in alphabet]
    for n, byte in enumerate(moved):
        alphabet[byte] = chr(256 + n)
    return dict(sorted(alphabet.items()))


def token_bytes(tokenizer) -> list[bytes | None]:
    """For every token id `i < len(tokenizer)`, the bytes token `i` adds to the text; `None` for
    a special token, which is not text.

    `b"".join(token_bytes(tok)[i] for i in ids)` is the UTF-8 encoding of `tok.decode(ids)` for
    any ids without special tokens, also when a character is split between two tokens.
    """
    byte_of = {char: byte for byte, char in byte_level_alphabet().items()}
    # BEGIN SOLUTION
    special = set(tokenizer.all_special_ids)
    strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    # Each character of a token string stands for one byte: map it back (never `.encode()` the
    # string, and never decode one token alone: its bytes may be part of a character).
    return [
        None if i in special else bytes(byte_of[char] for char in string)
        for i, string in enumerate(strings)
    ]
    # END SOLUTION
