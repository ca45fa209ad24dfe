"""Tokenization warm-up: a model never sees characters, only token ids."""


def token_strings(tokenizer, text: str) -> list[str]:
    """Split `text` into the strings of its tokens, in order.

    `"".join(token_strings(tokenizer, text)) == text` for any text the tokenizer can encode
    without adding special tokens.
    """
    # BEGIN SOLUTION
    ids = tokenizer.encode(text, add_special_tokens=False)
    # Decode each id on its own: byte-level BPE stores a leading space inside the token.
    return [tokenizer.decode([i]) for i in ids]
    # END SOLUTION
