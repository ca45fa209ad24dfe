"""Chapter 3's learner-style mutants (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS = [
    Mutant(
        "greedy_and_temperature",
        "return logits.argmax(dim=-1)",
        "return logits.argmax(dim=0)",
        "argmax over the batch instead of the vocabulary",
        says=("batch", "vocabulary"),
    ),
    Mutant(
        "greedy_and_temperature",
        "return logits.argmax(dim=-1)",
        "return logits.argmax(dim=-1, keepdim=True)",
        "one token per row, but shaped [batch, 1] instead of [batch]",
        says=("shape", "extra dimension"),
    ),
    # Temperature
    Mutant(
        "greedy_and_temperature",
        "return logits / temperature",
        "return logits * temperature",
        "logits multiplied by the temperature",
        says=("multiplying", "divided"),
    ),
    Mutant(
        "greedy_and_temperature",
        "    return logits / temperature  # the same T for every logit of every row",
        "    logits /= temperature\n    return logits",
        "logits divided in place: the caller's tensor changes",
        says=("in place",),
    ),
    Mutant(
        "greedy_and_temperature",
        "return logits / temperature",
        "return logits.div_(temperature)",
        "divided in place with div_: the caller's logits change",
        says=("in place",),
    ),
    # Frequency penalty
    Mutant(
        "apply_frequency_penalty",
        "return logits - freq_penalty * counts",
        "return logits + freq_penalty * counts",
        "the penalty added instead of subtracted",
        says=("added", "subtract"),
    ),
    Mutant(
        "apply_frequency_penalty",
        "freq_penalty * counts.view(batch, d_vocab).to(logits.dtype)",
        "freq_penalty * (counts.view(batch, d_vocab) > 0).to(logits.dtype)",
        "a presence penalty: each token counted once however often it occurs",
        says=("presence", "occurrence"),
    ),
    Mutant(
        "apply_frequency_penalty",
        "weights = None if mask is None else mask.flatten().to(logits.dtype)",
        "weights = None",
        "the mask ignored: padding counted",
        says=("mask", "padding"),
    ),
    Mutant(
        "apply_frequency_penalty",
        "offsets = torch.arange(batch, device=input_ids.device)[:, None] * d_vocab",
        "offsets = torch.zeros(batch, 1, dtype=torch.long, device=input_ids.device)",
        "one count for the whole batch: rows share their counts",
        says=("row", "whole batch"),
    ),
    Mutant(
        "apply_frequency_penalty",
        "    return logits - freq_penalty * counts.view(batch, d_vocab).to(logits.dtype)",
        "    logits -= freq_penalty * counts.view(batch, d_vocab).to(logits.dtype)\n"
        "    return logits",
        "the penalty subtracted in place: the caller's logits change",
        says=("in place", "logits"),
    ),
    Mutant(
        "apply_frequency_penalty",
        "(input_ids + offsets).flatten()",
        "input_ids.add_(offsets).flatten()",
        "the row offsets added to input_ids in place: the caller's token ids change",
        says=("in place", "token ids"),
    ),
    # sample_basic
    Mutant(
        "sample_basic",
        "probs = logits.softmax(dim=-1)",
        "probs = logits.exp()",
        "exp(logits) handed to multinomial: overflows to inf for large logits",
        says=("exp", "overflow"),
    ),
    Mutant(
        "sample_basic",
        "probs = logits.softmax(dim=-1)",
        "probs = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)",
        "softmax written out without subtracting the max: inf / inf for large logits",
        says=("subtract", "max"),
    ),
    Mutant(
        "sample_basic",
        "    probs = logits.softmax(dim=-1)",
        "    logits -= logits.max(dim=-1, keepdim=True).values  # for stability\n"
        "    probs = logits.softmax(dim=-1)",
        "the max subtracted in place for stability: the caller's logits change",
        says=("in place",),
    ),
    Mutant(
        "sample_basic",
        "num_samples=1, generator=generator)",
        "num_samples=1)",
        "the generator ignored: a seed changes nothing",
        says=("generator",),
    ),
    Mutant(
        "sample_basic",
        "generator=generator).squeeze(-1)",
        "generator=generator).squeeze()",
        "squeeze() without a dimension: a batch of one gives a 0-d tensor",
        says=("squeeze", "batch of one"),
    ),
    Mutant(
        "sample_basic",
        "probs = logits.softmax(dim=-1)",
        "probs = logits.softmax(dim=0)",
        "softmax over the batch instead of the vocabulary",
        says=("batch", "vocabulary"),
    ),
    # Top-k
    Mutant(
        "sample_top_k",
        "logits.masked_fill(logits < kth_largest,",
        "logits.masked_fill(logits <= kth_largest,",
        "the k-th token dropped too: k - 1 kept",
        says=("k-th largest", "itself"),
    ),
    Mutant(
        "sample_top_k",
        "return sample_basic(filter_top_k(logits, k), generator)",
        "return sample_basic(filter_top_k(logits, k))",
        "top-k sampling ignores the generator",
        says=("generator",),
    ),
    Mutant(
        "sample_top_k",
        "    kth_largest = logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1:]\n"
        '    return logits.masked_fill(logits < kth_largest, float("-inf"))',
        "    top = logits.topk(min(k, logits.shape[-1]), dim=-1)\n"
        '    return torch.full_like(logits, float("-inf")).scatter(-1, top.indices, top.values)',
        "exactly k tokens kept: a tie with the k-th is dropped",
        says=("tie",),
    ),
    Mutant(
        "sample_top_k",
        'return logits.masked_fill(logits < kth_largest, float("-inf"))',
        'return logits.masked_fill_(logits < kth_largest, float("-inf"))',
        "masked_fill_ in place: the caller's logits lose their tail",
        says=("in place",),
    ),
    # Top-p
    Mutant(
        "sample_top_p",
        "remove_sorted = before >= top_p",
        "remove_sorted = before > top_p",
        "a token kept when the tokens before it reach exactly top_p",
        says=("exactly", "at least"),
    ),
    Mutant(
        "sample_top_p",
        "remove_sorted = before >= top_p",
        "first = torch.zeros_like(cumulative[:, :1], dtype=torch.bool)\n"
        "    remove_sorted = torch.cat([first, cumulative[:, :-1] > top_p], dim=-1)",
        "the inclusive total shifted right by one, compared with > : a token kept when the "
        "tokens before it reach exactly top_p",
        name="shifted-cumsum-strict",
        says=("exactly", "at least"),
    ),
    Mutant(
        "sample_top_p",
        "before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=-1)",
        "before = cumulative - sorted_logits.softmax(dim=-1)",
        "the mass before each token as cumulative - p: the subtraction rounds under top_p",
        name="cumsum-minus-p",
        says=("cumulative - p", "rounds"),
    ),
    Mutant(
        "sample_top_p",
        "remove_sorted = before >= top_p",
        "remove_sorted = cumulative > top_p",
        "the token that crosses top_p dropped",
        says=("crosses",),
    ),
    Mutant(
        "sample_top_p",
        "remove_sorted[:, :min_tokens_to_keep] = False",
        "remove_sorted[:, :1] = False",
        "min_tokens_to_keep ignored",
        says=("min_tokens_to_keep",),
    ),
    Mutant(
        "sample_top_p",
        "remove = remove_sorted.scatter(dim=-1, index=order, src=remove_sorted)",
        "remove = remove_sorted.gather(dim=-1, index=order)",
        "the sort undone with gather instead of scatter",
        says=("scatter", "original order"),
    ),
    Mutant(
        "sample_top_p",
        "return sample_basic(filter_top_p(logits, top_p, min_tokens_to_keep), generator)",
        "return sample_basic(filter_top_p(logits, top_p, min_tokens_to_keep))",
        "top-p sampling ignores the generator",
        says=("generator",),
    ),
    Mutant(
        "sample_top_p",
        'return logits.masked_fill(remove, float("-inf"))',
        'return logits.masked_fill_(remove, float("-inf"))',
        "masked_fill_ in place: the caller's logits lose their tail",
        says=("in place",),
    ),
    # TransformerSampler.sample and next_logits
    Mutant(
        "sample",
        "input_ids[None], logits, generator=generator, **kwargs",
        "input_ids[None, -self.cfg.n_ctx :], logits, generator=generator, **kwargs",
        "the frequency penalty counts only the tokens the model still sees",
        says=("frequency penalty", "n_ctx"),
        try_first="test_frequency_penalty_counts_tokens_the_model_no_longer_sees",
    ),
    Mutant(
        "sample",
        "            input_ids = torch.cat([input_ids, next_token])\n"
        "            if verbose:\n"
        '                print(self.tokenizer.decode(next_token), end="", flush=True)\n'
        "            if stop_at_eos and next_token.item() == eos:\n"
        "                break\n",
        "            if stop_at_eos and next_token.item() == eos:\n"
        "                break\n"
        "            input_ids = torch.cat([input_ids, next_token])\n"
        "            if verbose:\n"
        '                print(self.tokenizer.decode(next_token), end="", flush=True)\n',
        "stops before appending the end-of-text token",
        says=("end-of-text", "last token"),
        try_first="test_sampling_stops_at_end_of_text",
    ),
    Mutant(
        "sample",
        "if stop_at_eos and next_token.item() == eos:",
        "if next_token.item() == eos:",
        "stop_at_eos=False ignored",
        says=("stop_at_eos",),
        try_first="test_sampling_goes_on_past_end_of_text_without_stop_at_eos",
    ),
    Mutant(
        "sample",
        "input_ids[None], logits, generator=generator, **kwargs",
        "input_ids[None], logits, **kwargs",
        "the seeded generator not passed on",
        says=("generator",),
        try_first="test_seeded_sampling_is_reproducible",
    ),
    Mutant(
        "sample",
        "input_ids[None], logits, generator=generator, **kwargs",
        "input_ids[None], logits, generator=generator",
        "the sampling options (temperature, top_k, ...) not passed on",
        says=("temperature", "sampling options"),
    ),
    Mutant(
        "sample",
        "return self.model(input_ids[None, -self.cfg.n_ctx :])[:, -1]",
        "return self.model(input_ids[None, -self.cfg.n_ctx :])[:, 0]",
        "the logits of the first position instead of the last",
        says=("first position", "last position"),
    ),
    Mutant(
        "sample",
        "return self._finish(prompt, input_ids, verbose)",
        "return self._finish(prompt, input_ids[-self.cfg.n_ctx :], verbose)",
        "the returned text cropped to n_ctx tokens",
        says=("return", "whole sequence"),
        try_first="test_sampling_past_the_context_window_reads_the_last_n_ctx_tokens",
    ),
    Mutant(
        "sample",
        "for _ in tqdm(range(max_tokens_generated),",
        "for _ in tqdm(range(max_tokens_generated - 1),",
        "one token too few",
        says=("too few",),
    ),
    # No-repeat n-grams
    Mutant(
        "no_repeat_ngram",
        "prefix = tokens[:, seq - (ngram_size - 1) :]",
        "prefix = tokens[:, -(ngram_size - 1) :]",
        "the prefix as tokens[:, -(n - 1):], which is the whole row when n = 1",
        says=("ngram_size=1", "whole row"),
    ),
    Mutant(
        "no_repeat_ngram",
        "ngrams = tokens.unfold(dimension=1, size=ngram_size, step=1)",
        "ngrams = tokens[:, :-1].unfold(dimension=1, size=ngram_size, step=1)",
        "the last n-gram of the row not counted",
        says=("last n-gram",),
    ),
    Mutant(
        "no_repeat_ngram",
        "banned[beam_index, ngrams[beam_index, ngram_index, -1]] = True",
        "banned[beam_index, ngrams[beam_index, ngram_index, 0]] = True",
        "the first token of the matching n-gram banned instead of the one that would follow",
        says=("first token", "follow"),
    ),
    Mutant(
        "no_repeat_ngram",
        "    if seq < ngram_size:\n        return banned  # not one complete n-gram yet\n",
        "",
        "rows shorter than ngram_size not handled: unfold refuses a window longer than the row",
        says=("no complete n-gram", "no token is banned"),
    ),
    # Beams: top_continuations and filter
    Mutant(
        "beams",
        "in_top = torch.arange(len(order), device=order.device) < num_beams",
        "in_top = torch.arange(len(order)) < num_beams",
        "filter's ranks made without a device: on the CPU beside a GPU's beams",
        says=("without a device",),
    ),
    Mutant(
        "beams",
        "logprobs = logits.float().log_softmax(dim=-1)",
        "logprobs = logits.float()",
        "raw logits added up as scores instead of log-probabilities",
        says=("log_softmax", "raw"),
    ),
    Mutant(
        "beams",
        "new_sums = (logprob_sums[:, None] + top.values).flatten()",
        "new_sums = top.values.flatten()",
        "the parent's score forgotten",
        says=("parent",),
    ),
    Mutant(
        "beams",
        "[tokens.repeat_interleave(k, dim=0), top.indices.flatten()[:, None]]",
        "[tokens.repeat(k, 1), top.indices.flatten()[:, None]]",
        "repeat instead of repeat_interleave: continuations glued to the wrong parents",
        says=("parent", "k times in a row"),
    ),
    Mutant(
        "beams",
        "order = self.logprob_sums.argsort(descending=True, stable=True)",
        "order = self.logprob_sums.argsort(stable=True)",
        "beams ranked worst first",
        says=("worst first", "descending"),
    ),
    Mutant(
        "beams",
        "continuing = order[~ends_in_eos][:num_beams]",
        "continuing = order[:num_beams][~ends_in_eos[:num_beams]]",
        "the finished beams dropped from the top num_beams: fewer keep running",
        says=("take their places",),
    ),
    Mutant(
        "beams",
        "finished = order[ends_in_eos & in_top]",
        "finished = order[ends_in_eos]",
        "every finished beam kept, also those outside the best num_beams",
        says=("among the best",),
    ),
    Mutant(
        "beams",
        """        # Banned after the softmax, as HF does: the other tokens keep their log-probs.
        logprobs = logprobs.masked_fill(banned, float("-inf"))""",
        """        logprobs = logprobs.masked_fill(banned, float("-inf")).log_softmax(dim=-1)""",
        "log-probabilities renormalised after the n-gram ban",
        says=("renormalised", "ban"),
    ),
    # beam_search
    Mutant(
        "beam_search",
        "candidates = beams.generate(num_beams + 1, no_repeat_ngram_size)",
        "candidates = beams.generate(num_beams, no_repeat_ngram_size)",
        "num_beams continuations per beam instead of num_beams + 1",
        says=("num_beams + 1",),
        try_first="test_beam_search_end_of_text_and_stopping_rules",
    ),
    Mutant(
        "beam_search",
        "early_stopping or beams.logprob_sums.max().item() <= finished[-1][0]",
        "early_stopping or beams.logprob_sums.max().item() <= finished[0][0]",
        "compares with the best finished score instead of the worst",
        says=("worst",),
        try_first="test_beam_search_end_of_text_and_stopping_rules",
    ),
    Mutant(
        "beam_search",
        "if len(finished) == num_beams and (",
        "if len(finished) >= 1 and (",
        "stops once one sequence has finished",
        says=("num_beams sequences",),
        try_first="test_beam_search_end_of_text_and_stopping_rules",
    ),
    Mutant(
        "beam_search",
        "        finished = sorted(finished + beams.to_list(), key=lambda b: -b[0])[:num_beams]\n",
        "        finished = finished or beams.to_list()\n",
        "out of tokens, the running beams do not compete with the finished ones",
        says=("out of tokens", "compete"),
        try_first="test_beam_search_end_of_text_and_stopping_rules",
    ),
    Mutant(
        "beam_search",
        "key=lambda b: -b[0])[:num_beams]\n        if verbose:",
        "key=lambda b: -b[0])\n        if verbose:",
        "more than num_beams finished sequences kept",
        says=("past num_beams",),
        try_first="test_beam_search_keeps_only_num_beams_finished_sequences",
    ),
    Mutant(
        "beam_search",
        "finished = sorted(finished + newly_finished.to_list(), key=lambda b: -b[0])[:num_beams]",
        "finished = (finished + newly_finished.to_list())[:num_beams]",
        "finished sequences kept in the order they finished, not best first",
        says=("sorted", "best first"),
        try_first="test_beam_search_end_of_text_and_stopping_rules",
    ),
    Mutant(
        "beam_search",
        "finished = sorted(finished + newly_finished.to_list(), key=lambda b: -b[0])[:num_beams]",
        "finished = sorted(finished + newly_finished.to_list(), key=lambda b: -b[0] / len(b[1]))"
        "[:num_beams]",
        "finished sequences ranked by their mean log-probability per token",
        says=("mean log-probability", "sum"),
        try_first="test_beam_search_end_of_text_and_stopping_rules",
    ),
    Mutant(
        "beam_search",
        "early_stopping or beams.logprob_sums.max().item() <= finished[-1][0]",
        "not early_stopping or beams.logprob_sums.max().item() <= finished[-1][0]",
        "early_stopping read the wrong way round",
        says=("early_stopping", "wrong way round"),
        try_first="test_beam_search_end_of_text_and_stopping_rules",
    ),
    # issue 33: slips a learner's run of the blank notebook made, each to be named
    Mutant(
        "greedy_and_temperature",
        "return logits / temperature  # the same T for every logit of every row",
        "return (logits.softmax(dim=-1) / temperature).log()",
        "the temperature applied after the softmax",
        says=("after the softmax",),
    ),
    Mutant(
        "sample_top_k",
        "kth_largest = logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1:]",
        "kth_largest = logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1]",
        "the threshold shaped [batch]: it lines up with the vocabulary, not the rows",
        says=("threshold", "size-1 axis"),
    ),
    # Issue 43: slips a learner's run found passing or told the wrong thing
    Mutant(
        "sample",
        "        eos = self.tokenizer.eos_token_id\n"
        "        for _ in tqdm(range(max_tokens_generated), disable=not progress, "
        'desc="sampling"):\n'
        "            logits = self.next_logits(input_ids)\n"
        "            # The penalty counts every token so far, also those the model can no "
        "longer see.\n"
        "            next_token = self.sample_next_token(\n"
        "                input_ids[None],",
        "        eos = self.tokenizer.eos_token_id\n"
        "        prompt_ids = input_ids\n"
        "        for _ in tqdm(range(max_tokens_generated), disable=not progress, "
        'desc="sampling"):\n'
        "            logits = self.next_logits(input_ids)\n"
        "            next_token = self.sample_next_token(\n"
        "                prompt_ids[None],",
        "the frequency penalty counts only the prompt's tokens, not those generated since",
        name="penalty-counts-prompt-only",
        says=("prompt", "generated"),
    ),
    Mutant(
        "apply_frequency_penalty",
        "offsets = torch.arange(batch, device=input_ids.device)[:, None] * d_vocab",
        "offsets = torch.arange(batch)[:, None] * d_vocab",
        "the row offsets made without device=: on a GPU they sit on the CPU beside GPU ids",
        name="offsets-no-device",
        says=("device",),
    ),
    Mutant(
        "greedy_and_temperature",
        "return logits / temperature  # the same T for every logit of every row",
        "return (logits / temperature).softmax(dim=-1)",
        "apply_temperature returns probabilities (a softmax) instead of logits",
        name="temperature-returns-probabilities",
        says=("probabilities", "logits"),
    ),
    Mutant(
        "sample_basic",
        "probs = logits.softmax(dim=-1)",
        "probs = logits",
        "logits handed straight to torch.multinomial: no softmax",
        name="no-softmax",
        says=("softmax", "probabilities", "logits"),
    ),
    # Issue 43's sweep of SLIPS.md: slips whose first message did not name them
    Mutant(
        "sample_basic",
        "probs = logits.softmax(dim=-1)",
        "probs = logits.log_softmax(dim=-1)",
        "log-probabilities handed to torch.multinomial",
        name="log-softmax",
        says=("log-probabilities",),
    ),
    Mutant(
        "sample_top_k",
        'return logits.masked_fill(logits < kth_largest, float("-inf"))',
        "return logits.softmax(dim=-1).masked_fill(logits < kth_largest, 0.0)",
        "filter_top_k returns probabilities (removed ones at 0) instead of logits",
        name="returns-probabilities",
        says=("probabilities", "logits"),
    ),
    Mutant(
        "sample_top_p",
        "cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)",
        "cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=0)",
        "the running total taken down the batch: each token compared with one probability",
        name="cumsum-over-batch",
        says=("running total", "last dimension"),
    ),
    Mutant(
        "sample_top_p",
        "cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)",
        "cumulative = sorted_logits.cumsum(dim=-1)",
        "the running total of the logits, not of the probabilities",
        name="cumsum-of-logits",
        says=("logits", "probabilities"),
    ),
    Mutant(
        "sample",
        "return self.model(input_ids[None, -self.cfg.n_ctx :])[:, -1]",
        "return self.model(input_ids[None, -self.cfg.n_ctx + 1 :])[:, -1]",
        "the window one token shorter than n_ctx",
        name="window-one-short",
        says=("one token fewer", "off by one"),
        try_first="test_sampling_past_the_context_window_reads_the_last_n_ctx_tokens",
    ),
    Mutant(
        "apply_frequency_penalty",
        "offsets = torch.arange(batch, device=input_ids.device)[:, None] * d_vocab",
        "offsets = torch.arange(1, batch + 1, device=input_ids.device)[:, None] * d_vocab",
        "the row offsets start at d_vocab: row 0 shifted one row too far",
        name="offsets-from-1",
        says=("offsets start at 0",),
    ),
    Mutant(
        "beams",
        "top.indices.flatten()[:, None]",
        "top.indices.T.flatten()[:, None]",
        "the top tokens flattened rank by rank: continuations glued to the wrong parents",
        name="tokens-rank-by-rank",
        says=("rank by rank", "wrong parent"),
    ),
    Mutant(
        "beams",
        "logprobs = logits.float().log_softmax(dim=-1)",
        "logprobs = logits.float().log_softmax(dim=0)",
        "log_softmax over the beams instead of the vocabulary",
        name="log-softmax-over-beams",
        says=("beams", "vocabulary"),
    ),
    Mutant(
        "sample",
        "input_ids[None], logits, generator=generator, **kwargs",
        "input_ids[None], logits,\n"
        "                generator=None if seed is None else torch.Generator().manual_seed(seed),\n"
        "                **kwargs",
        "a generator seeded afresh at every step: every step draws the same random numbers",
        name="reseeded-each-step",
        says=("every step", "seeded again"),
    ),
]
