"""SamplingParams: how one request wants its tokens drawn (vLLM's `SamplingParams`, by name).

Every request in a continuous batch carries its own: one row may be greedy while its neighbour
samples at temperature 1.2 with top-p. The rules are chapter 3's (`sample_next_token`), applied
row by row, and each request draws from its own seeded generator, so that its tokens do not
depend on what else is in the batch.
"""

from dataclasses import dataclass

from solutions import checks
from solutions.sampling import check_sampling_args


@dataclass(frozen=True)
class SamplingParams:
    """vLLM's names: `max_tokens` new tokens at most; `ignore_eos=True` keeps going past an
    end-of-text (chapter 3's `stop_at_eos=False`); `top_k=None` and `top_p=None` are off.
    A `seed` gives the request its own generator (the engine makes it); `seed=None` draws from
    PyTorch's global generator, shared with every other unseeded request. A temperature above 0
    and below 1e-5 means greedy, as in vLLM (chapter 3's samplers refuse it by name)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    frequency_penalty: float = 0.0
    max_tokens: int = 16
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if (
            isinstance(self.temperature, int | float)
            and 0 < self.temperature < checks.MIN_TEMPERATURE
        ):
            object.__setattr__(self, "temperature", 0.0)  # vLLM's rule: as good as greedy
        check_sampling_args(self.temperature, self.top_k, self.top_p, 1, self.frequency_penalty)
        checks.integer("max_tokens", self.max_tokens, low=1)
        if self.seed is not None:
            checks.integer("seed", self.seed, low=0)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")

    def sampling_kwargs(self) -> dict:
        """The arguments of chapter 3's `sample_next_token`."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "frequency_penalty": self.frequency_penalty,
        }
