"""Sampling per row: each row's temperature, top-k, top-p, min-p and penalties as tensors applied to every row at
once, and random draws keyed on (the row's seed, the row's own forward number, the slot), so a seeded row draws
the same numbers whatever other rows decode beside it (continuous batching: a request's text does not depend on
the load).

Two callers build one. Continuous batching gives every request its own `SamplingParams` (OpenAI's meaning:
temperature 0 is greedy). `generate()` gives one list of logits processors to all rows: when it holds only the
processors this module applies densely, in transformers' order (`from_processors`), the loop uses the dense path
(no per-length grouping in lossless verification, so no host read for it) and the list is dropped. Rows draw
their keys from torch's global generator then, so `torch.manual_seed(s)` still makes a call reproducible, and a
request seeded with `s` in continuous batching gets the same key as a one-row `generate()` after
`torch.manual_seed(s)` (`row_key`).

Greedy rows take the argmax of their processed scores (penalties only), exactly as transformers' greedy search.
"""

from dataclasses import dataclass, fields

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation import logits_process as lp

from .draws import draw, draw_key, keyed_uniforms, row_key
from .penalties import SeenTokens
from .window import Updates

FILL, ACCEPT, NEXT, BRANCH = 0, 1, 2, 3
"""What a row's random numbers of one forward are for (each keyed apart): mask slots drafted, drafts' acceptance
tests, the token after the verified ones, a second branch's acceptance tests (`tree.py`)."""


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling, as OpenAI and vLLM read it: temperature 0 is greedy, `top_k` 0 and `top_p` 1 and
    `min_p` 0 are off; `repetition_penalty` is transformers' (every token seen, prompt included);
    `frequency_penalty` / `presence_penalty` are OpenAI's (logit -= f * count + p * [count > 0], over the output);
    `logit_bias` (token id, bias) pairs are added to the logits first (OpenAI's, in [-100, 100])."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self):
        checks = {
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "top_k": isinstance(self.top_k, int) and self.top_k >= 0,
            "min_p": 0 <= self.min_p <= 1,
            "repetition_penalty": self.repetition_penalty > 0,
            "frequency_penalty": -2 <= self.frequency_penalty <= 2,
            "presence_penalty": -2 <= self.presence_penalty <= 2,
            "seed": self.seed is None or isinstance(self.seed, int),
            "logit_bias": all(isinstance(t, int) and t >= 0 and -100 <= b <= 100 for t, b in self.logit_bias),
        }
        for name, valid in checks.items():
            if not valid:
                raise ValueError(f"`{name}`={getattr(self, name)!r} is out of range (SamplingParams documents each).")

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0

    @classmethod
    def from_generation_config(cls, config: GenerationConfig, **overrides) -> "SamplingParams":
        """A generation config's sampling as `generate()` reads it (`do_sample` decides; an unset field takes
        transformers' default, so top-k is 50; single-token `sequence_bias` entries are the logit bias), then
        `overrides`."""
        sample, defaults = bool(config.do_sample), GenerationConfig._get_default_generation_params()
        value = {name: getattr(config, name) if getattr(config, name) is not None else defaults[name]
                 for name in ("temperature", "top_p", "top_k")}
        values = {
            "temperature": float(value["temperature"]) if sample else 0.0,
            "top_p": float(value["top_p"]) if sample else 1.0,
            "top_k": int(value["top_k"]) if sample else 0,
            "min_p": float(config.min_p or 0.0) if sample else 0.0,
            "repetition_penalty": float(config.repetition_penalty or 1.0),
        }
        bias = config.sequence_bias or {}
        values["logit_bias"] = tuple((int(key[0]), float(value)) for key, value in bias.items() if len(key) == 1)
        return cls(**{**values, **overrides})


class RowSampling:
    """Per input row (the output record's rows, so it joins and forgets rows with it): what `SamplingParams`
    says, as tensors, and the row's key. Built from host values, so the batch-wide switches (any row sampling,
    any penalty, the largest top-k) are known without reading the device."""

    def __init__(self, params: list[SamplingParams], keys: list[int], device: torch.device | str, mask_id: int,
                 of_requests: bool):
        self.params, self.keys, self.device, self.mask_id = list(params), list(keys), device, mask_id
        self.of_requests = of_requests
        """Rows are requests of their own (continuous batching), not one `generate()` call's: left padding is not
        a seen token (it would be in transformers' batched `generate()`), and rows that join later may sample, so
        the loop keeps the sampling structure even while every row is greedy."""
        column = {
            f.name: [getattr(p, f.name) for p in params] for f in fields(SamplingParams)
            if f.name not in ("seed", "logit_bias")
        }
        as_float = {name: torch.tensor(v, dtype=torch.float32, device=device) for name, v in column.items()}
        self.sample = as_float["temperature"] > 0
        self.temperature = torch.where(self.sample, as_float["temperature"], 1.0)
        self.top_k = torch.tensor(column["top_k"], dtype=torch.long, device=device)
        self.top_p_removed = torch.tensor([1 - p for p in column["top_p"]], dtype=torch.float32, device=device)
        self.min_p, self.repetition = as_float["min_p"], as_float["repetition_penalty"]
        self.frequency, self.presence = as_float["frequency_penalty"], as_float["presence_penalty"]
        self.key = torch.tensor(keys, dtype=torch.long, device=device)
        self.any_sample = any(p.do_sample for p in params)
        self.most_top_k = max((p.top_k for p in params if p.do_sample), default=0)
        self.any_repetition = any(p.repetition_penalty != 1 for p in params)
        self.any_openai = any(p.frequency_penalty or p.presence_penalty for p in params)
        self.any_top_p = any(p.top_p < 1 and p.do_sample for p in params)
        self.any_min_p = any(p.min_p > 0 and p.do_sample for p in params)
        self.may_sample = self.any_sample or of_requests
        self.penalised = None
        """(rows,) whether a row's scores read its prefix (a penalty), or None where no row's do."""
        if self.any_repetition or self.any_openai:
            self.penalised = (self.repetition != 1) | (self.frequency != 0) | (self.presence != 0)
        self.biases = [(row, token, bias) for row, p in enumerate(params) for token, bias in p.logit_bias]
        self._bias: torch.Tensor | None = None
        self.counted_from: torch.Tensor | None = None
        """Per input row of a `generate()` call, the first column the repetition penalty counts (its padding and
        any `prompt_ignore_length` before it); rows of requests count from their first prompt token."""

    @classmethod
    def for_requests(cls, params: list[SamplingParams], device, mask_id: int) -> "RowSampling":
        """Each request's own; an unseeded one gets a key from torch's global generator."""
        keys = [row_key(p.seed) if p.seed is not None else draw_key() for p in params]
        return cls(params, keys, device, mask_id, of_requests=True)

    @classmethod
    def from_processors(
        cls, processors: LogitsProcessorList, do_sample: bool, rows: int, device, mask_id: int
    ) -> "RowSampling | None":
        """The dense equivalent of `generate()`'s `processors` (every row alike), or None where some processor has
        none, or the order differs from the one applied here (penalties, then temperature, top-k, top-p, min-p),
        or there is nothing to do (greedy without processors: the loop's argmax is cheaper)."""
        values, order, counted_from = {}, [], None
        for processor in processors:
            kind = type(processor)
            if kind is lp.RepetitionPenaltyLogitsProcessor:
                values["repetition_penalty"], stage = float(processor.penalty), 0
                ignored = processor.prompt_ignore_length  # generate() passes each row's left padding
                counted_from = torch.as_tensor(0 if ignored is None else ignored, device=device).expand(rows)
            elif kind is lp.TemperatureLogitsWarper:
                values["temperature"], stage = float(processor.temperature), 1
            elif kind is lp.TopKLogitsWarper and processor.filter_value == -float("inf"):
                values["top_k"], stage = int(processor.top_k), 2
            elif kind is lp.TopPLogitsWarper and processor.min_tokens_to_keep == 1:
                values["top_p"], stage = float(processor.top_p), 3
            elif kind is lp.MinPLogitsWarper and processor.min_tokens_to_keep == 1:
                values["min_p"], stage = float(processor.min_p), 4
            else:
                return None
            order.append(stage)
        if order != sorted(order) or not (do_sample or values):
            return None
        if do_sample:
            values.setdefault("temperature", 1.0)
        else:
            values = {"repetition_penalty": values.get("repetition_penalty", 1.0)}
        params = SamplingParams(**values)
        sampling = cls([params] * rows, [draw_key() for _ in range(rows)], device, mask_id, of_requests=False)
        sampling.counted_from = counted_from
        return sampling

    def joined(self, other: "RowSampling") -> Updates:
        joined = RowSampling(self.params + other.params, self.keys + other.keys, self.device, self.mask_id,
                             self.of_requests)
        return [(self, vars(joined))]

    def keep(self, rows: list[int]) -> None:
        kept = RowSampling([self.params[r] for r in rows], [self.keys[r] for r in rows], self.device, self.mask_id,
                           self.of_requests)
        vars(self).update(vars(kept))

    # ----- scores -----

    def seen(self, record, state, vocab_size: int, drafts: torch.Tensor | None = None) -> SeenTokens | None:
        """What the running rows' penalties read (`SeenTokens`: only the kinds some row's penalty reads), or None
        when no row has a penalty. `record` and `state`: the loop's output record and window state."""
        if not (self.any_repetition or self.any_openai):
            return None
        if self.of_requests:  # (their prompts' padding moves as rows join)
            first_real = record.prompt_length - state.first_position
        else:
            first_real = self.counted_from[state.rows]
        return SeenTokens.before(
            record.sequences[state.rows], vocab_size, record.prompt_length,
            record.prompt_length + state.generated, first_real, drafts,
            context=self.any_repetition, output=self.any_openai,
        )

    def processed(self, scores: torch.Tensor, rows: torch.Tensor, seen: SeenTokens | None) -> torch.Tensor:
        """(n, positions, vocab) float scores of input rows `rows` (n,) through each row's penalties (`seen`: the
        tokens before each position) and, for sampling rows, its warpers; greedy rows keep the penalised scores."""
        if self.biases:
            scores = scores + self.bias(scores.shape[-1])[rows][:, None]
        if seen is not None and self.any_repetition:
            penalty = self.repetition[rows][:, None, None]
            penalised = torch.where(scores < 0, scores * penalty, scores / penalty)
            scores = torch.where(seen.context > 0, penalised, scores)
        if seen is not None and self.any_openai:
            counts = seen.output
            scores = scores - self.frequency[rows][:, None, None] * counts
            scores = scores - self.presence[rows][:, None, None] * (counts > 0).to(scores.dtype)
        if not self.any_sample:
            return scores
        sample = self.sample[rows][:, None, None]
        warped = scores / self.temperature[rows][:, None, None]
        warped[..., self.mask_id] = -float("inf")  # the mask id marks empty slots: a sampling row never draws it
        if self.most_top_k:
            top_k = self.top_k[rows]
            kth = warped.topk(min(self.most_top_k, warped.shape[-1]), dim=-1).values
            kth = kth.gather(-1, (top_k.clamp(min=1, max=kth.shape[-1]) - 1)[:, None, None].expand(*kth.shape[:2], 1))
            warped = warped.masked_fill((warped < kth) & (top_k > 0)[:, None, None], -float("inf"))
        if self.any_top_p:
            ascending, order = warped.sort(dim=-1)
            removed = ascending.softmax(-1).cumsum(-1) <= self.top_p_removed[rows][:, None, None]
            removed[..., -1] = False
            warped = warped.masked_fill(removed.scatter(-1, order, removed), -float("inf"))
        if self.any_min_p:
            probs = warped.softmax(-1)
            floor = self.min_p[rows][:, None, None] * probs.amax(-1, keepdim=True)
            warped = warped.masked_fill(probs < floor, -float("inf"))
        return torch.where(sample, warped, scores)

    def bias(self, vocab_size: int) -> torch.Tensor:
        """(rows, vocab) each row's `logit_bias`, dense (built once)."""
        if self._bias is None:
            rows, tokens, biases = zip(*self.biases)
            self._bias = torch.zeros(len(self.params), vocab_size, device=self.device)
            index = (torch.tensor(rows, device=self.device), torch.tensor(tokens, device=self.device))
            self._bias.index_put_(index, torch.tensor(biases, device=self.device))
        return self._bias

    # ----- draws -----

    def uniforms(
        self, rows: torch.Tensor, forward: torch.Tensor, purpose: int, count: int, index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(n, count) numbers in (0, 1) for input rows `rows` at their own forward number `forward` (n,): those of
        indices 0..count-1, or of `index` (n, count)."""
        index = torch.arange(count, device=rows.device) if index is None else index
        return keyed_uniforms(self.key[rows], forward, purpose, index)

    def choose(
        self, scores: torch.Tensor, rows: torch.Tensor, forward: torch.Tensor, purpose: int,
        index: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(n, k) tokens from processed `scores` (n, k, vocab): a sampling row's drawn from softmax(scores), a
        greedy row's the argmax; and the distributions drawn from (None when no row samples). `index` (n, k):
        which slots the k columns are (default 0..k-1), so a slot gets the same draw however it is reached."""
        greedy = scores.argmax(-1)
        if not self.any_sample:
            return greedy, None
        probs = scores.softmax(-1)
        drawn = draw(probs, self.uniforms(rows, forward, purpose, scores.shape[1], index))
        return torch.where(self.sample[rows][:, None], drawn, greedy), probs
