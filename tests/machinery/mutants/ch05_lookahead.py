"""Chapter 5's learner-style mutants of lookahead decoding: the pass's layout, the harvest, the
verification and the round (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS: list[Mutant] = [
    # lookahead_layout
    Mutant(
        "lookahead_layout",
        "offsets[q] = 1 + i + j",
        "offsets[q] = i + j",
        "window positions off by one: level 0 starts at `last`'s own position",
        name="window-offsets-off-by-one",
    ),
    Mutant(
        "lookahead_layout",
        "offsets[q] = 1 + i + j",
        "offsets[q] = 1 + i",
        "every level at the same positions (the levels' shift forgotten)",
    ),
    Mutant(
        "lookahead_layout",
        "offsets[q] = 1 + k",
        "offsets[q] = k",
        "candidate positions off by one",
    ),
    Mutant(
        "lookahead_layout",
        "allowed[q, first + g * C : q + 1] = True",
        "allowed[q, 1 : q + 1] = True",
        "a candidate reads the whole window and the candidates before it",
        name="candidate-reads-the-window",
    ),
    Mutant(
        "lookahead_layout",
        "allowed[:, 0] = True",
        "allowed[:, 0] = True\n    allowed[1 : 1 + L * W, 1 + L * W :] = True",
        "the window reads the verification branch",
        name="window-reads-the-candidates",
    ),
    Mutant(
        "lookahead_layout",
        "allowed[q, [at(0, c) for c in range(i)]] = True",
        "allowed[q, [at(j, c) for c in range(i)]] = True",
        "a window token reads its own level's earlier columns instead of level 0's",
    ),
    Mutant(
        "lookahead_layout",
        "allowed[q, [at(level, i) for level in range(j + 1)]] = True",
        "allowed[q, q] = True",
        "a window token reads only itself in its column: no trajectory",
    ),
    Mutant(
        "lookahead_layout",
        "allowed[q, first + g * C : q + 1] = True",
        "allowed[q, first + g * C : q] = True",
        "a candidate token does not read itself",
    ),
    # lookahead_harvest
    Mutant(
        "lookahead_harvest",
        "return [(int(g[0]), tuple(g[1:].tolist())) for g in grams]",
        "return [(int(g[-1]), tuple(g[:-1].tolist())) for g in grams]",
        "the n-gram keyed on its last token (the new one)",
        name="pool-keyed-on-the-wrong-token",
    ),
    Mutant(
        "lookahead_harvest",
        "grams = torch.cat([levels, new[None]], dim=0).T",
        "grams = torch.cat([levels, new[None]], dim=0)",
        "levels read as n-grams (rows) instead of columns",
    ),
    Mutant(
        "lookahead_harvest",
        "grams = torch.cat([levels, new[None]], dim=0).T",
        "grams = torch.cat([levels[1:], new[None]], dim=0).T",
        "the oldest level left out: (n - 1)-grams keyed one position late",
    ),
    # lookahead_verify
    Mutant(
        "lookahead_verify",
        "noise = gumbel_noise((n + 1, logits.shape[-1]), generator)",
        "noise = gumbel_noise((n_cand, n + 1, logits.shape[-1]), generator)",
        "fresh noise for every candidate: the naive verifier, biased",
        name="fresh-noise-per-candidate",
    ),
    Mutant(
        "lookahead_verify",
        "runs = matches.int().cumprod(dim=1).sum(dim=1)",
        "runs = matches.int().sum(dim=1)",
        "counts every match, not the leading run",
    ),
    Mutant(
        "lookahead_verify",
        "picks = (logits / temperature + noise).argmax(dim=-1)",
        "picks = ((logits + noise) / temperature).argmax(dim=-1)",
        "the temperature divides the noise too",
    ),
    Mutant(
        "lookahead_verify",
        "noise = gumbel_noise((n + 1, logits.shape[-1]), generator)",
        "noise = gumbel_noise((n + 1, logits.shape[-1]), None)",
        "the noise ignores the generator",
    ),
    Mutant(
        "lookahead_verify",
        "best = int(runs.argmax())",
        "best = 0",
        "always candidate 0's run",
    ),
    # lookahead_round
    Mutant(
        "lookahead_round",
        "keep[start : start + run] = True",
        "keep[past + 1 : past + 1 + run] = True",
        "the cache keeps the window's first columns instead of the chosen candidate's run",
        name="cache-keeps-the-guesses",
    ),
    Mutant(
        "lookahead_round",
        "start = past + first + best * (ngram - 1)",
        "start = past + first",
        "the cache keeps candidate 0's run, not the chosen one's",
    ),
    Mutant(
        "lookahead_round",
        "state.cache = cache.keep_only(keep[None])",
        "state.cache = cache",
        "the cache keeps every token of the pass",
    ),
    Mutant(
        "lookahead_round",
        "main, feed[None], state.cache, positions=past + offsets, allowed=allowed",
        "main, feed[None], state.cache, positions=offsets, allowed=allowed",
        "positions without the cache's length",
    ),
    Mutant(
        "lookahead_round",
        "torch.ones(len(feed), past, dtype=torch.bool), allowed_new",
        "torch.zeros(len(feed), past, dtype=torch.bool), allowed_new",
        "the pass does not read the cache",
    ),
    Mutant(
        "lookahead_round",
        "keep[: past + 1] = True",
        "keep[:past] = True",
        "the cache forgets `last`",
    ),
]
