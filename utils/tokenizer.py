"""Byte-level BPE tokenizers, trained with the `tokenizers` library and saved in HF format."""

from __future__ import annotations

from collections.abc import Iterable

EOS = "<|endoftext|>"


def train_bpe(texts: Iterable[str], vocab_size: int):
    """A GPT-2 style byte-level BPE tokenizer with one special token, `<|endoftext|>`.

    Returns a `transformers.PreTrainedTokenizerFast`; `save_pretrained(dir)` writes
    `tokenizer.json` + `tokenizer_config.json`, which `AutoTokenizer` loads from the folder.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(vocab_size, int) or vocab_size < 257:
        raise ValueError(f"vocab_size must be an integer >= 257 (bytes + EOS), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    # No added prefix space: the text is tokenized exactly as written, like GPT-2.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS
    )
