"""Chapter 2: training, graded against PyTorch's own loss and optimizer, HF's schedule, and
brute-force definitions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.graded._explain import explain_difference

CHAPTER = "02_training"


class TinyLM(nn.Module):
    """A model nobody has to write: embedding -> linear. Enough to test a training loop."""

    def __init__(self, d_vocab: int = 11, d_model: int = 8, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(d_vocab, d_model)
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, d_vocab)

    def forward(self, tokens):
        return self.out(self.ln(self.embed(tokens)))


# --------------------------------------------------------------------------- token_windows


@pytest.mark.token_windows
@pytest.mark.parametrize(
    ("n_tokens", "n_ctx", "stride"), [(20, 4, 4), (21, 4, 4), (17, 5, 2), (6, 5, 1)]
)
def test_windows_cover_the_stream(impl, n_tokens, n_ctx, stride):
    tokens = torch.arange(100, 100 + n_tokens)
    data = impl.TokenWindows(tokens, n_ctx, stride=stride)
    starts = [s for s in range(0, n_tokens, stride) if s + n_ctx + 1 <= n_tokens]
    assert len(data) == len(starts), (
        f"{n_tokens} tokens, n_ctx={n_ctx}, stride={stride}: expected {len(starts)} windows, "
        f"got {len(data)}. Windows start every `stride` tokens from 0, and one that starts at s "
        "needs the tokens s to s + n_ctx (its last target too): count the starts that fit."
    )
    for i, s in enumerate(starts):
        x, y = data[i]
        assert torch.equal(x, tokens[s : s + n_ctx]), (
            f"window {i} should start at token {s} (windows start every stride={stride} tokens, "
            f"here n_ctx={n_ctx})"
        )
        assert torch.equal(y, tokens[s + 1 : s + n_ctx + 1]), (
            f"the targets of window {i} must be its inputs shifted left by one"
        )


@pytest.mark.token_windows
def test_windows_default_stride_and_negative_index(impl):
    tokens = torch.arange(50)
    data = impl.TokenWindows(tokens, 8)
    assert len(data) == 6, (
        f"with the default stride (= n_ctx), 50 tokens give 6 windows of 8, got {len(data)}"
    )
    x, y = data[-1]
    assert torch.equal(x, tokens[40:48]) and torch.equal(y, tokens[41:49]), (
        f"data[-1] must be the last window, inputs 40..47 and targets 41..48; got inputs "
        f"{x.tolist()} and targets {y.tolist()}. A negative index counts from the end, as for "
        "a list: i % len(self)"
    )
    with pytest.raises(IndexError):
        data[len(data)]
        pytest.fail(
            f"data[{len(data)}] (= len(data)) must raise IndexError: there is no such window"
        )


# --------------------------------------------------------------------------- lm_loss


@pytest.mark.lm_loss
def test_lm_loss_matches_torch_cross_entropy(impl):
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(4, 7, 13, generator=gen)
    targets = torch.randint(0, 13, (4, 7), generator=gen)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    try:
        loss = impl.lm_loss(logits, targets)
    except RuntimeError as err:
        if "Expected target size" not in str(err):
            raise
        pytest.fail(
            f"lm_loss on logits (4, 7, 13) and targets (4, 7) raised {str(err).splitlines()[0]!r}. "
            "F.cross_entropy and F.nll_loss read the classes from dim 1 of a 3-d input, so they "
            "took the 7 positions for the classes. Flatten batch and positions into one axis "
            "first (logits (28, 13), targets (28,)), or take the log-softmax over the last dim "
            "yourself."
        )
    assert isinstance(loss, torch.Tensor) and loss.shape == (), "return a scalar tensor"
    over_positions = -logits.log_softmax(dim=1).gather(-1, targets[..., None]).mean()
    if torch.allclose(loss, over_positions, atol=1e-5):
        pytest.fail(
            "Your log-softmax normalises over the positions (dim 1): each position's "
            "distribution is over the vocabulary, the last dim."
        )
    assert torch.allclose(loss, expected, atol=1e-5), (
        f"got {loss.item():.5f}, expected {expected.item():.5f}: the mean over every position "
        "of -log softmax(logits)[target]"
    )


@pytest.mark.lm_loss
def test_lm_loss_of_known_models(impl):
    targets = torch.randint(0, 50, (2, 9))
    uniform = impl.lm_loss(torch.zeros(2, 9, 50), targets)
    assert math.isclose(uniform.item(), math.log(50), rel_tol=1e-5), (
        "a model that spreads its bets evenly over 50 tokens has loss log(50) nats"
    )
    certain = impl.lm_loss(F.one_hot(targets, 50).float() * 100, targets)
    assert certain.item() < 1e-6, "a model certain of the right token has loss 0"


@pytest.mark.lm_loss
def test_lm_loss_is_finite_when_a_confident_model_is_wrong(impl):
    logits = torch.zeros(1, 2, 5)
    logits[0, 0, 3] = 200.0  # position 0 is sure of token 3 ...
    targets = torch.tensor([[1, 3]])  # ... and token 1 came: about 200 nats of surprise
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss = impl.lm_loss(logits, targets)
    assert torch.isfinite(loss), (
        f"the loss is {loss.item()} on a row whose favourite logit is 200 above the target's "
        "(cross-entropy there is about 200 nats, not infinite). Did you take log(softmax(x))? "
        "softmax rounds a probability of e^-200 to exactly 0 in float32, and log(0) = -inf; "
        "log_softmax computes x - logsumexp(x) and never forms the tiny probability."
    )
    assert torch.allclose(loss, expected, rtol=1e-5), (
        f"got {loss.item():.4f}, expected {expected.item():.4f} on a confident row"
    )


@pytest.mark.lm_loss
def test_lm_loss_has_gradients(impl):
    logits = torch.randn(2, 3, 5, requires_grad=True)
    loss = impl.lm_loss(logits, torch.zeros(2, 3, dtype=torch.long))
    assert isinstance(loss, torch.Tensor) and loss.requires_grad, (
        "lm_loss returned a loss with no gradient to follow back to the logits (it has no "
        "grad_fn): the loss must stay differentiable, so no .item(), .detach() or "
        "torch.tensor(...) around it inside lm_loss; the optimiser's step needs its graph."
    )
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0, (
        "the loss must stay differentiable: no .item() or .detach() inside lm_loss"
    )


# --------------------------------------------------------------------------- lr_schedule


@pytest.mark.lr_schedule
@pytest.mark.parametrize(
    ("warmup", "total", "min_ratio"), [(10, 100, 0.1), (0, 50, 0.0), (5, 5, 0.2)]
)
def test_lr_factor_matches_transformers(impl, warmup, total, min_ratio):
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    hf = get_cosine_with_min_lr_schedule_with_warmup(
        opt, num_warmup_steps=warmup, num_training_steps=total, min_lr_rate=min_ratio
    )
    for step in range(total + 1):
        expected = hf.lr_lambdas[0](step)
        try:
            got = impl.lr_factor(step, warmup, total, min_ratio)
        except ZeroDivisionError:
            phase = (
                "with warmup_steps = 0 there is no warm-up, and your warm-up divides by its 0 steps"
                if warmup == 0
                else "with total_steps = warmup_steps the cosine phase lasts 0 steps, and your "
                "progress divides by that length"
            )
            pytest.fail(
                f"lr_factor({step}, warmup_steps={warmup}, total_steps={total}) divided by "
                f"zero: {phase}. A phase of no steps must still give a factor: count its length "
                "as at least 1 step, as HF's schedule does."
            )
        to_zero = get_cosine_with_min_lr_schedule_with_warmup(
            opt, num_warmup_steps=warmup, num_training_steps=total, min_lr_rate=0.0
        ).lr_lambdas[0](step)
        if min_ratio and not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9):
            if math.isclose(got, to_zero, rel_tol=1e-6, abs_tol=1e-9):
                pytest.fail(
                    f"step {step}: your cosine decays towards 0; it must end at min_lr_ratio "
                    f"({min_ratio}): min + (1 - min) * (1 + cos(pi * progress)) / 2."
                )
        assert math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9), (
            f"step {step} (warmup {warmup}, total {total}, min {min_ratio}): expected "
            f"{expected:.6f}, got {got:.6f}. Warm-up is step / warmup_steps; then "
            "min + (1 - min) * (1 + cos(pi * progress)) / 2, the progress counted from the end "
            "of the warm-up (0 there) to total_steps (1 there, and after)."
        )


@pytest.mark.lr_schedule
def test_lr_factor_stays_at_the_minimum_after_total_steps(impl):
    # The docstring's contract: after total_steps the factor stays at min_lr_ratio. (HF's
    # schedule is not the oracle here: past the end it lets the cosine rise again.)
    for step in (101, 150, 250, 10_000):
        got = impl.lr_factor(step, 10, 100, 0.1)
        assert math.isclose(got, 0.1, rel_tol=1e-9), (
            f"lr_factor({step}, warmup_steps=10, total_steps=100, min_lr_ratio=0.1) is "
            f"{got:.6f}: after total_steps it must stay at min_lr_ratio. Clamp the progress "
            "at 1, or the cosine climbs back up"
        )


# --------------------------------------------------------------------------- train_step


class ModeRecorder(TinyLM):
    """TinyLM that records whether it was in training mode at each forward pass: a model with
    dropout behaves differently in the two modes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.modes: list[bool] = []

    def forward(self, tokens):
        self.modes.append(self.training)
        return super().forward(tokens)


def _reference_step(model, x, y, lr, clip):
    """One AdamW step written out with PyTorch's own pieces."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(
        torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def _batch(seed=1, d_vocab=11):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, d_vocab, (4, 6), generator=gen), torch.randint(
        0, d_vocab, (4, 6), generator=gen
    )


@pytest.mark.train_step
def test_train_step_matches_a_pytorch_step(impl):
    model, ref = TinyLM(), TinyLM()
    x, y = _batch()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    expected_loss = _reference_step(ref, x, y, lr=0.05, clip=0.5)
    loss = impl.train_step(model, opt, sched, x, y, 0.5)
    assert isinstance(loss, float), "train_step returns the loss as a Python float (.item())"
    assert math.isclose(loss, expected_loss, rel_tol=1e-5), "return the loss BEFORE the update"
    same = same_weights(model, ref)
    if not same and all(
        torch.equal(p, q) for p, q in zip(model.parameters(), TinyLM().parameters(), strict=True)
    ):
        pytest.fail(
            "the weights did not move at all: the optimizer found no gradients. Were they "
            "zeroed after backward() instead of before it?"
        )
    if not same:  # the known mistakes, each one step of PyTorch's own pieces
        for mistake, lr, clip in [
            (
                "the step used the NEXT step's learning rate: the scheduler moved on before the "
                "optimizer used the current one",
                0.05 / 2,
                0.5,
            ),
            (
                "the update used the gradients as they were, not clipped: clipping after the "
                "optimizer's step (or not at all) changes nothing it uses",
                0.05,
                math.inf,
            ),
        ]:
            variant = TinyLM()
            _reference_step(variant, x, y, lr=lr, clip=clip)
            if same_weights(model, variant):
                pytest.fail(f"the weights after train_step are those of a step in which {mistake}.")
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), (
            f"{name} differs from one step of PyTorch's own pieces (AdamW at the learning rate "
            "of this step, the gradient norm clipped to grad_clip). "
            + explain_difference(p.detach(), q.detach(), atol=1e-6, rtol=1e-5)
        )
    assert math.isclose(opt.param_groups[0]["lr"], 0.05 / 2), (
        "call scheduler.step() once per train_step, after optimizer.step()"
    )


@pytest.mark.train_step
def test_train_step_does_not_accumulate_gradients(impl):
    model, ref = TinyLM(), TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    for seed in (1, 2, 3):
        x, y = _batch(seed)
        impl.train_step(model, opt, sched, x, y, 1e9)
        ref_opt.zero_grad()
        F.cross_entropy(ref(x).flatten(0, 1), y.flatten()).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), (
            explain_difference(p.detach(), q.detach(), atol=1e-6, rtol=1e-5)
            + " After three steps the weights differ from three independent steps: are you "
            "zeroing the gradients before each backward()?"
        )


@pytest.mark.train_step
def test_train_step_trains_in_training_mode(impl):
    model = ModeRecorder().eval()  # as evaluate() may have left it
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    impl.train_step(model, opt, sched, *_batch(), 1.0)
    assert model.modes == [True], (
        f"the forward passes of train_step ran with model.training = {model.modes}: call "
        "model.train() first. After an evaluation the model is in eval mode, and a model "
        "with dropout would then train without it"
    )


@pytest.mark.train_step
def test_train_step_learns_a_tiny_corpus(impl):
    # A repeating sequence is perfectly predictable: loss must fall far below log(11).
    tokens = torch.tensor([1, 5, 2, 8, 3, 9, 4] * 8)
    x, y = tokens[:-1].view(1, -1), tokens[1:].view(1, -1)
    model = TinyLM(seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    losses = [impl.train_step(model, opt, sched, x, y, 1.0) for _ in range(80)]
    assert losses[-1] < 0.2 * losses[0], f"loss went from {losses[0]:.3f} to {losses[-1]:.3f}"


# --------------------------------------------------------------------------- evaluate


@pytest.mark.evaluate
def test_evaluate_is_the_token_weighted_mean(impl):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 11, (7, 5), generator=gen)
    y = torch.randint(0, 11, (7, 5), generator=gen)
    model = TinyLM()
    loader = DataLoader(TensorDataset(x, y), batch_size=3)  # batches of 3, 3, 1
    with torch.no_grad():
        expected = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    got = impl.evaluate(model, loader)
    assert math.isclose(got, expected, rel_tol=1e-5), (
        f"expected {expected:.5f}, got {got:.5f}: weight each batch by its number of tokens "
        "(the last batch is smaller), not every batch equally"
    )


@pytest.mark.evaluate
def test_evaluate_runs_the_model_in_eval_mode(impl):
    x, y = _batch()
    model = ModeRecorder().train()
    impl.evaluate(model, DataLoader(TensorDataset(x, y), batch_size=2))
    assert model.modes and not any(model.modes), (
        f"the forward passes of evaluate ran with model.training = {model.modes}: call "
        "model.eval() before evaluating (dropout must be off), and restore the mode after"
    )


@pytest.mark.evaluate
def test_evaluate_restores_the_mode_and_honours_max_batches(impl):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 11, (6, 5), generator=gen)
    y = torch.randint(0, 11, (6, 5), generator=gen)
    model = TinyLM().train()
    loader = DataLoader(TensorDataset(x, y), batch_size=2)
    with torch.no_grad():
        first_two = F.cross_entropy(model(x[:4]).flatten(0, 1), y[:4].flatten()).item()
    got = impl.evaluate(model, loader, max_batches=2)
    assert math.isclose(got, first_two, rel_tol=1e-5), "evaluate only max_batches batches"
    assert model.training, "evaluate must put the model back in training mode afterwards"
    model.eval()
    impl.evaluate(model, loader)
    assert not model.training, "...and leave a model that was in eval mode in eval mode"
