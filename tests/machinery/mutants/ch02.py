"""Chapter 2's learner-style mutants (see tests/machinery/mutants/__init__.py)."""

from tests.machinery.mutants import Mutant

MUTANTS = [
    # TokenWindows
    Mutant(
        "token_windows",
        "return chunk[:-1], chunk[1:]",
        "return chunk[:-1], chunk[:-1]",
        "targets not shifted: each position predicts itself",
        says=("shift",),
    ),
    Mutant(
        "token_windows",
        "return (len(self.tokens) - self.n_ctx - 1) // self.stride + 1",
        "return (len(self.tokens) - self.n_ctx) // self.stride + 1",
        "one window too many: the last one has no target for its last position",
        says=("windows",),
    ),
    Mutant(
        "token_windows",
        "return (len(self.tokens) - self.n_ctx - 1) // self.stride + 1",
        "return len(self.tokens) // self.n_ctx",
        "the number of windows ignores the stride",
        says=("stride",),
    ),
    Mutant(
        "token_windows",
        "start = (i % len(self)) * self.stride",
        "start = (i % len(self)) * self.n_ctx",
        "windows start every n_ctx tokens whatever the stride",
        says=("stride",),
    ),
    Mutant(
        "token_windows",
        "start = (i % len(self)) * self.stride",
        "start = i * self.stride",
        "a negative index counts from the start of the stream",
        says=("negative",),
    ),
    Mutant(
        "token_windows",
        "if not -len(self) <= i < len(self):",
        "if i > len(self):",
        "index len(self) accepted (off by one), negative ones unchecked",
        says=("IndexError",),
    ),
    # lm_loss
    Mutant(
        "lm_loss",
        "return -correct.mean()",
        "return -correct.sum()",
        "the sum of the losses instead of their mean",
        says=("mean",),
    ),
    Mutant(
        "lm_loss",
        "return -correct.mean()",
        "return correct.mean()",
        "the sign lost: the mean log-probability instead of its negative",
        says=("-log",),
    ),
    Mutant(
        "lm_loss",
        "log_probs = logits.log_softmax(dim=-1)",
        "log_probs = logits.log_softmax(dim=1)",
        "log-softmax over the positions instead of the vocabulary",
        says=("vocabulary",),
    ),
    Mutant(
        "lm_loss",
        "log_probs = logits.log_softmax(dim=-1)",
        "log_probs = logits.softmax(dim=-1).log()",
        "log(softmax(x)) instead of log_softmax(x): -inf where a probability underflows to 0",
        says=("log_softmax",),
    ),
    # lr_factor
    Mutant(
        "lr_schedule",
        "return step / max(1, warmup_steps)",
        "return (step + 1) / max(1, warmup_steps)",
        "warm-up off by one step",
        says=("warm-up",),
    ),
    Mutant(
        "lr_schedule",
        "return min_lr_ratio + (1.0 - min_lr_ratio) * cosine",
        "return cosine",
        "the cosine decays to 0, ignoring min_lr_ratio",
        says=("min_lr_ratio", "towards 0"),
    ),
    Mutant(
        "lr_schedule",
        "progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))",
        "progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)",
        "past total_steps the cosine rises again",
        says=("total_steps",),
    ),
    Mutant(
        "lr_schedule",
        "progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))",
        "progress = min(1.0, step / max(1, total_steps))",
        "the decay measured from step 0 instead of from the end of the warm-up",
        says=("warm-up",),
    ),
    # train_step
    Mutant(
        "train_step",
        "    model.train()\n",
        "",
        "the model never put in training mode (dropout stays off after an evaluation)",
        says=("train()",),
    ),
    Mutant(
        "train_step",
        "    optimizer.zero_grad(set_to_none=True)\n",
        "",
        "gradients never zeroed: they pile up from step to step",
        says=("zero",),
    ),
    Mutant(
        "train_step",
        "    optimizer.zero_grad(set_to_none=True)\n    loss.backward()\n",
        "    loss.backward()\n    optimizer.zero_grad(set_to_none=True)\n",
        "gradients zeroed after backward, so the step has none",
        says=("zero",),
    ),
    Mutant(
        "train_step",
        "    scheduler.step()  # the schedule moves once per optimizer step\n",
        "",
        "the learning-rate schedule never advances",
        says=("scheduler",),
    ),
    Mutant(
        "train_step",
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n",
        "",
        "the gradient norm not clipped",
        says=("clip",),
    ),
    # evaluate
    Mutant(
        "evaluate",
        "    model.eval()  # no dropout in our models, but a habit worth keeping\n",
        "",
        "evaluation in training mode (dropout on)",
        says=("eval()",),
    ),
    Mutant(
        "evaluate",
        "    model.train(was_training)\n",
        "",
        "the model left in eval mode afterwards",
        says=("mode",),
    ),
    Mutant(
        "evaluate",
        "total += lm_loss(model(x), y).item() * y.numel()\n        count += y.numel()",
        "total += lm_loss(model(x), y).item()\n        count += 1",
        "the mean over batches: a smaller last batch weighs as much as a full one",
        says=("token",),
    ),
    Mutant(
        "evaluate",
        "if max_batches is not None and i >= max_batches:",
        "if max_batches is not None and i > max_batches:",
        "one batch more than max_batches",
        says=("max_batches",),
    ),
    # issue 33: slips a learner's run of the blank notebook made, each to be named
    Mutant(
        "train_step",
        "    optimizer.step()\n    scheduler.step()  # the schedule moves once per optimizer step",
        "    scheduler.step()\n    optimizer.step()",
        "the scheduler stepped before the optimizer: the update uses the next step's rate",
        says=("next step's learning rate", "scheduler"),
    ),
    Mutant(
        "train_step",
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n    optimizer.step()\n",
        "    optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)\n",
        "the gradients clipped after the optimizer's step: the update used them unclipped",
        says=("not clipped", "after the optimizer's step"),
    ),
]
