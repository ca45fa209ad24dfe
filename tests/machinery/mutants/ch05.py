"""Chapter 5's learner-style mutants: the rejection sampler and speculative generation (see
tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS: list[Mutant] = [
    # rejection_sample_one
    Mutant(
        "rejection_sample_one",
        "if u * draft_probs[x] < target_probs[x]:",
        "if u < target_probs[x]:",
        "keeps the draft with probability p(x), forgetting q(x)",
    ),
    Mutant(
        "rejection_sample_one",
        "if u * draft_probs[x] < target_probs[x]:",
        "if u * target_probs[x] < draft_probs[x]:",
        "the ratio upside down: keeps with probability min(1, q/p)",
    ),
    Mutant(
        "rejection_sample_one",
        "residual = (target_probs - draft_probs).clamp(min=0)",
        "residual = target_probs.clone()",
        "resamples from p after a rejection instead of max(0, p - q)",
    ),
    Mutant(
        "rejection_sample_one",
        "residual = (target_probs - draft_probs).clamp(min=0)",
        "residual = (target_probs - draft_probs).abs()",
        "resamples from |p - q|: the tokens q over-proposes come back",
    ),
    Mutant(
        "rejection_sample_one",
        "x = int(torch.multinomial(draft_probs, 1, generator=generator))",
        "x = int(torch.multinomial(target_probs, 1, generator=generator))",
        "draws the draft from p instead of q",
    ),
    Mutant(
        "rejection_sample_one",
        "u = torch.rand((), generator=generator, device=draft_probs.device)",
        "u = torch.rand((), device=draft_probs.device)",
        "u drawn from the global generator",
    ),
    Mutant(
        "rejection_sample_one",
        "        return x, True\n",
        "        return x, False\n",
        "reports a kept draft as rejected",
    ),
    Mutant(
        "rejection_sample_one",
        "return torch.minimum(target_probs, draft_probs).sum(dim=-1)",
        "return (target_probs * draft_probs).sum(dim=-1)",
        "acceptance rate as sum p q (independent draws), not sum min(p, q)",
    ),
    Mutant(
        "rejection_sample_one",
        "return torch.minimum(target_probs, draft_probs).sum(dim=-1)",
        "return torch.minimum(target_probs, draft_probs).sum()",
        "acceptance rate summed over the whole batch",
    ),
    # rejection_sample
    Mutant(
        "rejection_sample",
        "        residual = torch.where(empty, target_probs[rows, at], residual)\n",
        "",
        "no fallback when the residual has no mass (p <= q everywhere): torch.multinomial fails",
        name="zero-residual",
    ),
    Mutant(
        "rejection_sample",
        "u = torch.rand(p.shape, generator=generator, device=p.device)",
        "u = torch.rand(p.shape[1], generator=generator, device=p.device)",
        "one uniform per position, shared by every row of the batch: rows are not independent",
        name="u-shared-by-rows",
    ),
    Mutant(
        "rejection_sample",
        "u = torch.rand(p.shape, generator=generator, device=p.device)",
        "u = torch.rand(p.shape[0], 1, generator=generator, device=p.device)",
        "one uniform per row, reused for its k drafts: positions are not independent",
        name="u-shared-by-positions",
    ),
    Mutant(
        "rejection_sample",
        "accepted = keep.long().cumprod(dim=1).bool()",
        "accepted = keep",
        "drafts after the first rejection are kept when they pass their own test",
    ),
    Mutant(
        "rejection_sample",
        "keep = u * q < p",
        "keep = u < p",
        "keeps a draft with probability p(x), forgetting q(x)",
    ),
    Mutant(
        "rejection_sample",
        "keep = u * q < p",
        "keep = u * p < q",
        "the ratio upside down",
    ),
    Mutant(
        "rejection_sample",
        "residual = (target_probs[rows, at] - draft_probs[rows, at]).clamp(min=0)",
        "residual = target_probs[rows, at].clone()",
        "resamples from p after a rejection",
    ),
    Mutant(
        "rejection_sample",
        "        residual = residual / residual.sum(dim=-1, keepdim=True)\n"
        "        dist = torch.where((n_accepted == k)[:, None], target_probs[:, k], residual)\n"
        "        next_token = torch.multinomial(dist, 1, generator=generator)[:, 0]\n",
        "        dist = torch.where((n_accepted == k)[:, None], target_probs[:, k], residual)\n"
        "        u2 = torch.rand(batch, 1, generator=generator)\n"
        "        last = dist.shape[-1] - 1\n"
        "        next_token = (dist.cumsum(dim=-1) < u2).sum(dim=-1).clamp(max=last)\n",
        "inverse-CDF sampling from max(0, p - q) without renormalising it",
        name="no-renormalisation",
    ),
    Mutant(
        "rejection_sample",
        "dist = torch.where((n_accepted == k)[:, None], target_probs[:, k], residual)",
        "dist = target_probs[:, k]",
        "the bonus token is drawn even after a rejection",
    ),
    Mutant(
        "rejection_sample",
        "at = n_accepted.clamp(max=k - 1)",
        "at = torch.zeros_like(n_accepted)",
        "the recovered token always uses position 0's distributions",
    ),
    Mutant(
        "rejection_sample",
        "u = torch.rand(p.shape, generator=generator, device=p.device)",
        "u = torch.rand(p.shape, device=p.device)",
        "u drawn from the global generator",
    ),
    Mutant(
        "rejection_sample",
        "keep = draft_tokens == best[:, :k]",
        "keep = draft_tokens == best[:, 1:]",
        "greedy: each draft compared with the NEXT position's argmax",
    ),
    Mutant(
        "rejection_sample",
        "tokens[:, :k] = torch.where(accepted, draft_tokens, -1)",
        "tokens[:, :k] = draft_tokens",
        "rejected drafts left in the output instead of -1",
    ),
    Mutant(
        "rejection_sample",
        "p = target_probs[:, :k].gather(-1, draft_tokens[..., None])[..., 0]  # [batch, k]",
        "p = target_probs[:, 1:].gather(-1, draft_tokens[..., None])[..., 0]  # [batch, k]",
        "each draft tested against the next position's target",
    ),
    # model_drafter
    Mutant(
        "model_drafter",
        "        self.cache = self.cache.keep_only(mask)\n",
        "",
        "the drafter's cache is not rolled back: rejected drafts stay in its context",
    ),
    Mutant(
        "model_drafter",
        "self.pending_mask = torch.stack([all_kept, torch.ones_like(all_kept)], dim=1)",
        "self.pending_mask = torch.ones_like(self.pending, dtype=torch.bool)",
        "the last draft is queued even when it was rejected",
    ),
    Mutant(
        "model_drafter",
        "keep = torch.cat([self.pending_mask, accepted[:, : k - 1]], dim=1) & ~done[:, None]",
        "keep = torch.cat([self.pending_mask, accepted[:, 1:]], dim=1) & ~done[:, None]",
        "the fed drafts matched with the wrong acceptance flags (off by one)",
    ),
    Mutant(
        "model_drafter",
        "        self.pending = torch.stack([drafts[:, -1], next_token], dim=1)\n",
        "        self.pending = torch.stack([drafts[:, -1], drafts[:, -1]], dim=1)\n",
        "the main model's token is never fed to the drafter",
    ),
    # speculative_round
    Mutant(
        "speculative_round",
        "    cache = cache.keep_only(mask)\n",
        "",
        "the main model's cache keeps the rejected drafts",
    ),
    Mutant(
        "speculative_round",
        "feed = torch.cat([last[:, None], drafts], dim=1)  # [batch, k + 1]",
        "feed = drafts  # [batch, k + 1]",
        "the main model is fed the drafts without the newest token",
    ),
    Mutant(
        "speculative_round",
        "keep = torch.cat([torch.ones_like(accepted[:, :1]), accepted], dim=1) & ~done[:, None]",
        "keep = torch.cat([accepted, torch.ones_like(accepted[:, :1])], dim=1) & ~done[:, None]",
        "acceptance flags matched with the wrong columns of the cache",
    ),
    Mutant(
        "speculative_round",
        "n_new = accepted.sum(dim=1) + 1",
        "n_new = accepted.sum(dim=1)",
        "the recovered / bonus token is dropped",
    ),
    Mutant(
        "speculative_round",
        "target, draft_probs, drafts, generator=generator, greedy=temperature == 0",
        "target, draft_probs, drafts, greedy=temperature == 0",
        "the sampler does not get the generator",
    ),
    Mutant(
        "speculative_round",
        "target = sampling_probs(logits, **sampling)  # [batch, k + 1, d_vocab]",
        "target = sampling_probs(logits, temperature)  # [batch, k + 1, d_vocab]",
        "top-k / top-p applied to the drafter only",
    ),
    # ngram_propose
    Mutant(
        "ngram_propose",
        "for start in range(len(text) - n - 1, -1, -1):",
        "for start in range(len(text) - n - 1):",
        "the OLDEST match wins instead of the most recent",
    ),
    Mutant(
        "ngram_propose",
        "for start in range(len(text) - n - 1, -1, -1):",
        "for start in range(len(text) - n, -1, -1):",
        "the text's own end matches itself",
    ),
    Mutant(
        "ngram_propose",
        "return text[start + n : start + n + k]",
        "return text[start + n : start + n + k - 1]",
        "one token fewer than k",
    ),
]
