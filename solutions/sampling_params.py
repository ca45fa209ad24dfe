"""SamplingParams: how one request wants its tokens drawn (vLLM's `SamplingParams`, by name).

Every request in a continuous batch carries its own: one row may be greedy while its neighbour
samples at temperature 1.2 with top-p. The rules are chapter 3's (`sample_next_token`), applied
row by row, and each request draws from its own seeded generator, so that its tokens do not
depend on what else is in the batch.
"""

import json
from dataclasses import dataclass

from solutions import checks
from solutions.sampling import check_sampling_args


@dataclass(frozen=True)
class StructuredOutputsParams:
    """What a request's text must be (vLLM's `StructuredOutputsParams`, by name): exactly one
    of a JSON schema (`json`, a dict or its JSON text), a `regex`, a `choice` of strings, a
    `grammar` (xgrammar's EBNF), or `json_object=True` (any JSON object, OpenAI's
    `response_format={"type": "json_object"}`). The engine compiles it (chapter 9's index, or
    xgrammar for what no regex can say) and masks every step of the request."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self):
        given = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None]  # fmt: skip
        if self.json_object is True:
            given.append("json_object")
        elif self.json_object is not False:
            raise ValueError(f"json_object must be True or False, got {self.json_object!r}")
        if len(given) != 1:
            raise ValueError(
                "structured_outputs: give exactly one of json, regex, choice, grammar and "
                f"json_object, got {given or 'none'}"
            )
        if isinstance(self.json, str):
            try:
                object.__setattr__(self, "json", json.loads(self.json))
            except ValueError as error:
                raise ValueError(f"structured_outputs.json is not valid JSON: {error}") from None
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"structured_outputs.json must be a JSON schema object, got "
                             f"{type(self.json).__name__}")  # fmt: skip
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
        if self.choice is not None:
            choices = self.choice
            if (
                not isinstance(choices, list | tuple)
                or not choices
                or not all(isinstance(c, str) and c for c in choices)
            ):
                raise ValueError("structured_outputs.choice must be a non-empty list of "
                                 f"non-empty strings, got {choices!r}")  # fmt: skip
            object.__setattr__(self, "choice", list(choices))

    @property
    def kind(self) -> str:
        """Which constraint this is: "json", "regex", "choice", "grammar" or "json_object"."""
        if self.json_object:
            return "json_object"
        return next(n for n in ("json", "regex", "choice", "grammar") if getattr(self, n))

    @property
    def key(self) -> tuple[str, str]:
        """The constraint as a hashable key: equal constraints share one compiled grammar."""
        value = {"json_object": True}.get(self.kind, getattr(self, self.kind))
        return self.kind, json.dumps(value, ensure_ascii=False)  # key order matters: kept


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
    structured_outputs: StructuredOutputsParams | None = None

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
        if self.structured_outputs is not None and not isinstance(
            self.structured_outputs, StructuredOutputsParams
        ):
            raise ValueError("structured_outputs must be a StructuredOutputsParams, got "
                             f"{type(self.structured_outputs).__name__}")  # fmt: skip

    def sampling_kwargs(self) -> dict:
        """The arguments of chapter 3's `sample_next_token`."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "frequency_penalty": self.frequency_penalty,
        }
