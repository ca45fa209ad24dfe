"""Chapter 9's learner-style mutants (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS = [
    # token_bytes
    Mutant(
        "token_bytes",
        "None if i in special else bytes(byte_of[char] for char in string)",
        "None if i in special else string.encode()",
        "the token's string encoded as UTF-8: the space marker taken for a character",
        says=("space marker", "Ġ"),
    ),
    Mutant(
        "token_bytes",
        "None if i in special else bytes(byte_of[char] for char in string)",
        "None if i in special else tokenizer.decode([i]).encode()",
        "each token decoded alone: part of a character becomes U+FFFD",
        says=("decode", "part of a character"),
    ),
    Mutant(
        "token_bytes",
        "None if i in special else bytes(byte_of[char] for char in string)",
        "bytes(byte_of.get(char, 0) for char in string)",
        "the special token given bytes as if it were text",
        says=("special token", "not text"),
    ),
    Mutant(
        "token_bytes",
        "special = set(tokenizer.all_special_ids)",
        "special = {0}",
        "end-of-text assumed to be id 0, the only special token",
        says=("special", "tokenizer"),
    ),
    # token_index
    Mutant(
        "token_index",
        "        if state is None:\n            return None\n    return state",
        "    return state",
        "the walk goes on after a byte with no transition",
        says=("dies",),
    ),
    Mutant(
        "token_index",
        "state = dfa.step(state, byte)",
        "state = dfa.step(dfa.initial, byte)",
        "every byte stepped from the initial state",
        says=("every byte",),
    ),
    Mutant(
        "token_index",
        "                if data is None:",
        "                if data is None or not data.isascii():",
        "tokens that are not whole characters refused (only ASCII tokens walked)",
        says=("multi-byte character", "walk bytes"),
    ),
    Mutant(
        "token_index",
        "end = walk(dfa, state, data)",
        "end = walk(dfa, state, data[:1])",
        "only the first byte of each token walked",
        says=("cannot lead to a match",),
    ),
    Mutant(
        "token_index",
        "            if state in dfa.finals:  # the text may stop here: end-of-text, going "
        "nowhere\n"
        "                row[eos_id] = state",
        "            row[eos_id] = state",
        "end-of-text allowed in every state",
        says=("end-of-text", "not a complete match"),
    ),
    Mutant(
        "token_index",
        "            if state in dfa.finals:  # the text may stop here: end-of-text, going "
        "nowhere\n"
        "                row[eos_id] = state",
        "            pass",
        "end-of-text never allowed",
        says=("end-of-text", "complete match"),
    ),
    Mutant(
        "token_index",
        "                row[eos_id] = state",
        "                row[0] = state",
        "end-of-text assumed to be token 0",
        says=("not 0",),
    ),
    Mutant(
        "token_index",
        "next_state = self.transitions[state].get(token)",
        "next_state = self.transitions[state].get(token, state)",
        "a refused token leaves the state as it is instead of being refused",
        says=("refused", "raise"),
    ),
    # mask_logits
    Mutant(
        "mask_logits",
        'return logits.masked_fill(~mask, float("-inf"))',
        'return logits.masked_fill(mask, float("-inf"))',
        "the mask read the wrong way round",
        says=("right way round",),
    ),
    Mutant(
        "mask_logits",
        'return logits.masked_fill(~mask, float("-inf"))',
        "return logits.masked_fill(~mask, -1e4)",
        "a large negative number instead of -inf",
        says=("-inf", "large negative"),
    ),
    Mutant(
        "mask_logits",
        'return logits.masked_fill(~mask, float("-inf"))',
        'return logits.masked_fill_(~mask, float("-inf"))',
        "masked in place: the caller's logits change",
        says=("in place",),
    ),
    Mutant(
        "mask_logits",
        "mask = torch.zeros(d_vocab, dtype=torch.bool, device=device)",
        "mask = torch.zeros(d_vocab, dtype=torch.bool)",
        "the mask made on the CPU whatever the device",
        says=("device",),
    ),
    # constrained_sampler
    Mutant(
        "constrained_sampler",
        "        if self.n_seen is not None:\n",
        "        if self.n_seen is None:\n            self.n_seen = 0\n        if True:\n",
        "the prompt's tokens walked through the constraint",
        says=("prompt",),
    ),
    Mutant(
        "constrained_sampler",
        "        self.n_seen = len(input_ids)\n",
        "        self.n_seen = self.n_seen if self.n_seen is not None else len(input_ids)\n",
        "the count of tokens read never moves on: tokens read again at every step",
        says=("once", "twice in a row"),
    ),
    Mutant(
        "constrained_sampler",
        "        if self.n_seen is not None:\n"
        "            for token in input_ids[self.n_seen :].tolist():\n"
        "                self.guide.advance(token)\n"
        "        self.n_seen = len(input_ids)\n"
        "        mask = token_mask(self.guide.allowed(), logits.shape[-1], logits.device)",
        "        guide = Guide(self.index)\n"
        "        if self.n_seen is not None:\n"
        "            for token in input_ids[self.n_seen :].tolist():\n"
        "                guide.advance(token)\n"
        "        self.n_seen = len(input_ids)\n"
        "        mask = token_mask(guide.allowed(), logits.shape[-1], logits.device)",
        "the guide kept in a local variable, made anew at each call: every step starts over "
        "from the constraint's beginning (a learner's run, chapter 9)",
        says=("made anew at each call",),
    ),
    Mutant(
        "constrained_sampler",
        "token_mask(self.guide.allowed(), logits.shape[-1], logits.device)",
        "token_mask(self.guide.allowed(), logits.shape[-1])",
        "the mask made on token_mask's default device, the CPU, whatever the logits' device "
        "(a learner's run, chapter 9)",
        says=("without the logits' device",),
    ),
    Mutant(
        "token_index",
        "            return None\n    return state",
        "            return None\n        return state",
        "walk's return indented into the loop: the state after the first byte comes back, "
        "and None over no bytes (a learner's run, chapter 9)",
        says=("inside the loop",),
    ),
    # json_schema
    Mutant(
        "json_schema",
        'return "(" + "|".join(literal(v) for v in values) + ")"',
        'return "(" + "|".join(json.dumps(v, ensure_ascii=False) for v in values) + ")"',
        "enum values put into the regex unescaped",
        says=("unescaped", "re.escape"),
    ),
    Mutant(
        "json_schema",
        'return "(" + "|".join(literal(v) for v in values) + ")"',
        'return "(" + "|".join(re.escape(json.dumps(v)) for v in values) + ")"',
        "json.dumps with its default ensure_ascii: non-ASCII characters as \\u escapes",
        says=("ensure_ascii=False",),
    ),
    Mutant(
        "json_schema",
        'return "(" + "|".join(literal(v) for v in values) + ")"',
        'return "(" + "|".join(re.escape(str(v)) for v in values) + ")"',
        "values written with Python's str",
        says=("Python's `str`",),
    ),
    Mutant(
        "json_schema",
        'return "(" + "|".join(literal(v) for v in values) + ")"',
        'return "|".join(literal(v) for v in values)',
        "an enum's alternatives not grouped",
        says=("not in a group",),
    ),
    Mutant(
        "json_schema",
        "return rf\"\\[({item}{more}){'?' if low == 0 else ''}\\]\"",
        'return rf"\\[({item}{more})\\]"',
        "the empty array refused",
        says=("empty array",),
    ),
    Mutant(
        "json_schema",
        "more = f\"(,{item}){{{max(low - 1, 0)},{'' if high is None else high - 1}}}\"",
        "more = f\"(,{item}){{{low},{'' if high is None else high}}}\"",
        "minItems and maxItems applied to the repeated part unchanged",
        says=("once fewer",),
    ),
    Mutant(
        "json_schema",
        'low, high = schema.get("minItems", 0), schema.get("maxItems")',
        "low, high = 0, None",
        "minItems and maxItems ignored",
        says=("ignored",),
    ),
    Mutant(
        "json_schema",
        'for key, sub in schema["properties"].items()]',
        'for key, sub in sorted(schema["properties"].items())]',
        "the keys in sorted order",
        says=("schema's order",),
    ),
    Mutant(
        "json_schema",
        'return r"\\{" + ",".join(fields) + r"\\}"',
        'return r"\\{" + ", ".join(fields) + r"\\}"',
        "a space after each comma between properties",
        says=("compact JSON",),
    ),
    Mutant(
        "json_schema",
        'fields = [f"{literal(key)}:{schema_to_regex(sub)}"',
        'fields = [f"\\"{key}\\":{schema_to_regex(sub)}"',
        "a key written between quotes unescaped",
        says=("unescaped",),
    ),
    Mutant(
        "json_schema",
        '        return f"({SCALARS[kind]})"',
        '        return SCALARS[kind] if kind != "number" else SCALARS["integer"]',
        "a number taken for an integer",
        says=("refuses",),
    ),
    Mutant(
        "json_schema",
        'low, high = schema.get("minItems", 0), schema.get("maxItems")',
        'low, high = schema.pop("minItems", 0), schema.pop("maxItems", None)',
        "the schema changed: its bounds popped (a learner's run, chapter 9)",
        says=("changed the schema",),
    ),
    Mutant(
        "json_schema",
        '    if "enum" in schema or "const" in schema:\n        values',
        '    if schema.get("type") in SCALARS:\n        return f"({SCALARS[schema[\'type\']]})"\n'
        '    if "enum" in schema or "const" in schema:\n        values',
        "the type read before enum or const (a learner's run, chapter 9)",
        says=("values decide",),
    ),
    Mutant(
        "json_schema",
        "{{{max(low - 1, 0)},",
        "{{{low - 1},",
        "minItems - 1 not kept at 0 or more: a negative bound (a learner's run, chapter 9)",
        says=("negative bound",),
    ),
    Mutant(
        "json_schema",
        '        if high == 0:\n            return r"\\[\\]"\n',
        "",
        "maxItems 0 not taken alone: the repeat {0,-1} (a learner's run, chapter 9)",
        says=("negative bound",),
    ),
    Mutant(
        "json_schema",
        'values = schema["enum"] if "enum" in schema else [schema["const"]]',
        'values = schema.get("enum", schema.get("const"))\n'
        "        values = values if isinstance(values, list) else [values]",
        "a list const taken for a list of values (a learner's run, chapter 9)",
        says=("refuses",),
    ),
    # token_bitmask
    Mutant(
        "token_bitmask",
        "<< torch.arange(BITS)).sum(dim=1)",
        "<< torch.arange(BITS - 1, -1, -1)).sum(dim=1)",
        "a word's bits in reverse order",
        says=("reverse order",),
    ),
    Mutant(
        "token_bitmask",
        "return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)",
        "return words.clamp(max=2**31 - 1).to(torch.int32)",
        "the top bit clamped away",
        says=("top bit",),
    ),
    Mutant(
        "token_bitmask",
        "return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)",
        "return words",
        "the words left as int64",
        says=("int32",),
    ),
    Mutant(
        "token_bitmask",
        "bits = torch.zeros(bitmask_width(d_vocab) * BITS, dtype=torch.int64)",
        "bits = torch.zeros(d_vocab // BITS * BITS + BITS * (d_vocab % BITS > 0), "
        "dtype=torch.int64)[: d_vocab // BITS * BITS or BITS]",
        "one word too few when d_vocab is not a multiple of 32",
        says=("rounded up",),
    ),
    Mutant(
        "token_bitmask",
        "bits = (bitmask[:, :, None] >> shifts) & 1",
        "bits = bitmask[:, :, None] >> shifts",
        "a bit read with >> alone, without & 1",
        says=("& 1",),
    ),
    Mutant(
        "token_bitmask",
        'return logits.masked_fill(~allowed, float("-inf"))',
        'return logits.masked_fill_(~allowed, float("-inf"))',
        "the logits changed in place",
        says=("changed the caller's logits",),
    ),
    Mutant(
        "token_bitmask",
        'return logits.masked_fill(~allowed, float("-inf"))',
        'return logits.masked_fill(allowed, float("-inf"))',
        "the mask read the wrong way round",
        says=("bit k of word w is 1",),
    ),
    # jump_forward
    Mutant(
        "jump_forward",
        "    while state not in dfa.finals and len(dfa.transitions[state]) == 1:",
        "    while len(dfa.transitions[state]) == 1:",
        "forcing on through a final state",
        says=("final state",),
    ),
    Mutant(
        "jump_forward",
        "    return whole_characters(bytes(data))",
        '    return bytes(data).decode("utf-8", errors="ignore")',
        "decoded with errors='ignore': the rest of a character dropped",
        says=("errors='ignore'",),
    ),
    Mutant(
        "jump_forward",
        "        data.append(byte)\n",
        "        data.append(byte)\n        break\n",
        "stopped after the first forced byte",
        says=("too early",),
    ),
    Mutant(
        "jump_forward",
        "    data = bytearray()\n",
        "    data = bytearray()\n    state = dfa.initial\n",
        "walked from the DFA's start instead of the state given",
        says=("state given",),
    ),
    Mutant(
        "token_bitmask",
        "    shifts = torch.arange(BITS, device=bitmask.device)",
        "    shifts = torch.arange(BITS)",
        "the shifts made on the CPU whatever the bitmask's device (a learner's run, chapter 9)",
        says=("device",),
    ),
    Mutant(
        "token_bitmask",
        '    return logits.masked_fill(~allowed, float("-inf"))',
        '    rows = [logits[i].masked_fill(~allowed[i], float("-inf")) for i in '
        "range(len(logits))]\n    return torch.stack(rows)",
        "a Python loop over the rows (a learner's run, chapter 9)",
        says=("loop over the batch",),
    ),
    Mutant(
        "jump_forward",
        "    return whole_characters(bytes(data))",
        '    return bytes(data).decode("utf-8")',
        "decoded strictly, without whole_characters (a learner's run, chapter 9)",
        says=("whole_characters is for",),
    ),
    Mutant(
        "token_index",
        "                end = walk(dfa, state, data)",
        "                end = walk(dfa, dfa.initial, data)",
        "each token walked from the DFA's start, whatever the row (a learner's run, chapter 9)",
        says=("dfa.initial",),
    ),
    Mutant(
        "token_bytes",
        "None if i in special else bytes(byte_of[char] for char in string)",
        "None if i in special else "
        "bytes(byte_of[char] for char in strings[(i + 1) % len(strings)])",
        "each entry the bytes of the next id's token: entries out of id order (a learner's run)",
        name="entries-out-of-id-order",
        says=("id order",),
    ),
    Mutant(
        "token_index",
        "            for token, data in enumerate(token_bytes):",
        "            for token, data in enumerate(token_bytes[1:]):",
        "ids shifted by one: enumerate over token_bytes[1:] (a learner's run, chapter 9)",
        says=("position in `token_bytes`",),
    ),
    Mutant(
        "constrained_sampler",
        "            for token in input_ids[self.n_seen :].tolist():",
        "            for token in input_ids[-1:].tolist():",
        "only the last token read at each call (a learner's run, chapter 9)",
        says=("only the last token",),
    ),
    Mutant(
        "constrained_sampler",
        "        return mask_logits(logits, mask[None])",
        "        return mask_logits(logits.softmax(-1), mask[None])",
        "probabilities handed on where logits are expected (a learner's run, chapter 9)",
        says=("softmax taken twice",),
    ),
    Mutant(
        "constrained_sampler",
        "        self.n_seen = len(input_ids)\n",
        "        self.n_seen = self.n_seen\n",
        "n_seen never set: the guide never moves on (a learner's run, chapter 9)",
        name="n-seen-never-set",
        says=("never moved on",),
    ),
    Mutant(
        "token_bitmask",
        "    allowed = bits.flatten(1)[:, : logits.shape[-1]].bool()",
        "    allowed = bits.transpose(1, 2).flatten(1)[:, : logits.shape[-1]].bool()",
        "the bits laid out bit by bit across the words (a learner's run, chapter 9)",
        says=("word by word",),
    ),
    Mutant(
        "token_bitmask",
        "    allowed = bits.flatten(1)[:, : logits.shape[-1]].bool()",
        "    allowed = bits.flatten(1)[:, -logits.shape[-1] :].bool()",
        "the spare bits dropped from the front (a learner's run, chapter 9)",
        says=("drop the last columns",),
    ),
    Mutant(
        "jump_forward",
        "    while state not in dfa.finals and len(dfa.transitions[state]) == 1:\n"
        "        ((byte, state),) = dfa.transitions[state].items()",
        "    while state not in dfa.finals and len(set(dfa.transitions[state].values())) == 1:\n"
        "        byte, state = next(iter(dfa.transitions[state].items()))",
        "one next state taken for one next byte (a learner's run, chapter 9)",
        says=("not the states",),
    ),
    Mutant(
        "token_bytes",
        "    special = set(tokenizer.all_special_ids)\n"
        "    strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))",
        "    strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))\n"
        "    special = {i for i, s in enumerate(strings)\n"
        '               if s.startswith("<|") and s.endswith("|>")}',
        "special tokens guessed from the shape of their names (a learner's run, chapter 9)",
        says=("shape of its name",),
    ),
    # A second learner's run of the whole chapter (50 slips, 45 named first before these).
    Mutant(
        "token_index",
        "                end = walk(dfa, state, data)",
        "                end = walk(dfa, state, data[:1])",
        "only each token's first byte walked (a learner's run, chapter 9)",
        says=("first byte",),
    ),
    Mutant(
        "constrained_sampler",
        "            for token in input_ids[self.n_seen :].tolist():",
        "            for token in input_ids[self.n_seen :]:",
        "0-d tensors handed to the guide, not ints (a learner's run, chapter 9)",
        says=("python int",),
    ),
    Mutant(
        "json_schema",
        "{{{max(low - 1, 0)},",
        "{{{low},",
        "minItems applied to the repeated `,item` part as it is (a learner's run, chapter 9)",
        says=("minItems applied",),
    ),
    Mutant(
        "json_schema",
        'else [schema["const"]]',
        'else schema["const"]',
        "a const read as a list of values (a learner's run, chapter 9)",
        says=("one value",),
    ),
    Mutant(
        "token_bitmask",
        "    allowed = bits.flatten(1)[:, : logits.shape[-1]].bool()",
        "    allowed = bits.flatten(1).bool()",
        "the spare bits past d_vocab kept (a learner's run, chapter 9)",
        says=("spare bits",),
    ),
    # More of the same learner's run: each slip a mutant
    Mutant(
        "token_bytes",
        "None if i in special else",
        'b"" if i in special else',
        "a special token given empty bytes instead of None (a learner's run, chapter 9)",
        name="special-empty-bytes",
        says=("special token", "give it none"),
    ),
    Mutant(
        "token_bytes",
        "list(range(len(tokenizer)))",
        "list(range(tokenizer.vocab_size))",
        "the ids counted by vocab_size: the tokens added after training left out "
        "(a learner's run, chapter 9)",
        name="vocab-size",
        says=("vocab_size",),
    ),
    Mutant(
        "token_bytes",
        "strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))",
        "strings = list(tokenizer.get_vocab())",
        "the token strings taken from get_vocab()'s keys, not in id order "
        "(a learner's run, chapter 9)",
        name="get-vocab-order",
        says=("id order", "get_vocab()"),
    ),
    Mutant(
        "token_index",
        "                row[eos_id] = state",
        "                row[eos_id] = dfa.initial",
        "end-of-text sent back to the initial state instead of staying put "
        "(a learner's run, chapter 9)",
        name="eos-to-initial",
        says=("end-of-text", "leave the state"),
    ),
    Mutant(
        "token_index",
        "        state = dfa.step(state, byte)\n        if state is None:\n            return None",
        "        if dfa.step(state, byte) is not None:\n            state = dfa.step(state, byte)",
        "a byte with no transition skipped, the walk going on (a learner's run, chapter 9)",
        name="walk-skips-dead-byte",
        says=("walk dies",),
    ),
    Mutant(
        "token_index",
        "                if end is not None:\n"
        "                    row[token] = end\n"
        "            if state in dfa.finals:  # the text may stop here: end-of-text, going "
        "nowhere\n"
        "                row[eos_id] = state",
        "                if end is not None:\n"
        "                    row[token] = end\n"
        "                    if end in dfa.finals:\n"
        "                        row[eos_id] = end",
        "end-of-text allowed where some token leads to a final state, not in the final state "
        "itself (a learner's run, chapter 9)",
        name="eos-where-a-token-ends-final",
        says=("end-of-text", "only to final states"),
    ),
    Mutant(
        "mask_logits",
        'return logits.masked_fill(~mask, float("-inf"))',
        'return logits.float().masked_fill(~mask, float("-inf"))',
        "the logits turned to float32 before masking (a learner's run, chapter 9)",
        name="cast-to-float32",
        says=("bfloat16", "float32"),
    ),
    Mutant(
        "mask_logits",
        "torch.tensor(allowed, dtype=torch.long, device=device)",
        "torch.tensor(allowed, dtype=torch.long)",
        "the index tensor made on the CPU whatever the device (a learner's run, chapter 9)",
        name="index-tensor-on-cpu",
        says=("torch.tensor", "device"),
    ),
    Mutant(
        "json_schema",
        "{'' if high is None else high - 1}",
        "{'' if high is None else high}",
        "maxItems applied to the repeated `,item` part as it is (a learner's run, chapter 9)",
        name="maxitems-applied-unchanged",
        says=("maxItems", "once fewer"),
    ),
    Mutant(
        "jump_forward",
        "    while state not in dfa.finals and len(dfa.transitions[state]) == 1:\n"
        "        ((byte, state),) = dfa.transitions[state].items()\n"
        "        data.append(byte)\n",
        "    while len(dfa.transitions[state]) == 1:\n"
        "        ((byte, state),) = dfa.transitions[state].items()\n"
        "        data.append(byte)\n"
        "        if state in dfa.finals:\n"
        "            break\n",
        "the finality checked only after a byte: forcing on from a final state "
        "(a learner's run, chapter 9)",
        name="final-checked-after-byte",
        says=("went on too far", "final state"),
    ),
]
