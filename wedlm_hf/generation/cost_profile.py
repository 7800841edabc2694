"""The forward cost model (`forward_cost.py`) for one model on its device: measured by a short profile, stored per
device and model, and chosen per call by `wedlm_forward_scale`.

A profile times forwards of `WIDTHS` tokens per row after a cached context of `CONTEXT` tokens at `BATCHES` rows
(medians of `REPEATS` interleaved, each shape after a warm-up forward and the whole after an untimed pass at batch
1, the device synchronized around each), stopping before a batch size that would run it past `BUDGET_S`, and fits
the scale and the wide forwards' premium to them (`forward_cost.fitted`); on a 2-vCPU AMD EPYC, about a second for
the embedded checkpoint. A wider forward's tokens after its first are mask slots, as a decoding window's are, so a
draft-only adapter's work at mask slots (`draft_adapter/gate.py`) is in its time.

When it runs: only where asked, `wedlm_forward_scale="measure"` (the stored profile, else one measured now and
stored) and `wedlm-hf bench` (which measures one to print it, and stores it with `--store-forward-cost`). The
default, `"auto"`, prices with the profile stored for this device and model, else the declared scale, and never
times anything: a call's draft widths (not its output, which is exact by construction) would otherwise hinge on
timings taken while the machine was busy with something else, differing between processes and between a first
call and the next. A stored profile is one measurement that every later process agrees on; delete its file (or
set `WEDLM_HF_FORWARD_COST` elsewhere) to return to the declared scales.
"""

import statistics
import time
from datetime import datetime, timezone
from typing import Protocol

import torch
import transformers
from transformers import DynamicCache, PreTrainedModel

from .forward_cost import ForwardCost, fitted
from .mask_slots import forward_with_mask_slots
from .transformers_version import CACHE_KEYWORD

BATCHES = (1, 8, 32)
WIDTHS = (1, 2, 4, 16)
CONTEXT = 32
REPEATS = 5
BUDGET_S = 2.0
"""The profile's shapes and its time limit, a warm-up pass at batch 1 included: batch 1 is always measured, a
larger batch size only where its forwards, priced by the model fitted to those measured before, still fit."""

CHOICES = ("auto", "measure", "declared")
"""`wedlm_forward_scale`'s named values (a number gives the scale itself; None is "auto")."""


def model_fingerprint(model: PreTrainedModel) -> str:
    """What a forward's cost depends on besides the device: the architecture's shape, dtype and attention."""
    config = model.config.get_text_config()
    shape = {name: getattr(config, name, None) for name in ("hidden_size", "num_hidden_layers", "num_attention_heads")}
    return (
        f"{type(config).__name__} hidden {shape['hidden_size']} layers {shape['num_hidden_layers']} heads "
        f"{shape['num_attention_heads']} vocab {config.vocab_size} {model.dtype} "
        f"{getattr(model.config, '_attn_implementation', None)}"
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _batch_samples(model: PreTrainedModel, rows: int) -> list[tuple[int, int, float]]:
    """(rows, width, median seconds) of a forward of each of `WIDTHS` tokens per row after `CONTEXT` cached ones (all
    but the first mask slots), the widths interleaved (a burst of other work on the machine slows all of them alike),
    the cache cropped back to the context after each."""
    device, vocab_size = model.device, model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(rows)
    cache = DynamicCache()
    context = torch.randint(vocab_size, (rows, CONTEXT), generator=generator).to(device)
    model(input_ids=context, use_cache=True, logits_to_keep=1, **{CACHE_KEYWORD: cache})
    inputs = {
        width: dict(
            input_ids=torch.randint(vocab_size, (rows, width), generator=generator).to(device),
            attention_mask=torch.ones(rows, CONTEXT + width, dtype=torch.long, device=device),
            position_ids=(CONTEXT + torch.arange(width, device=device)).expand(rows, -1),
            use_cache=True, logits_to_keep=width, **{CACHE_KEYWORD: cache},
        )
        for width in WIDTHS
    }
    masks = {width: torch.ones(rows, width - 1, dtype=torch.bool, device=device) for width in WIDTHS}
    seconds = {width: [] for width in WIDTHS}
    for _ in range(REPEATS + 1):  # the first: a warm-up of each width
        for width in WIDTHS:
            _synchronize(device)
            start = time.perf_counter()
            forward_with_mask_slots(model, masks[width], **inputs[width])
            _synchronize(device)
            seconds[width].append(time.perf_counter() - start)
            cache.crop(-width)  # (transformers 5: a negative count of tokens to drop)
    return [(rows, width, statistics.median(seconds[width][1:])) for width in WIDTHS]


def _expected_seconds(samples: list[tuple[int, int, float]], rows: int) -> float:
    """What `_batch_samples` at `rows` rows will take, by the cost model fitted to the `samples` so far."""
    scale, premium = fitted(samples)
    cost = ForwardCost(scale, verify_share=0.0, premium=premium)
    per_token = statistics.mean(seconds / cost.forward(done, width) for done, width, seconds in samples)
    return (REPEATS + 1) * per_token * sum(cost.forward(rows, width) for width in WIDTHS)


def measure_profile(model: PreTrainedModel, budget_s: float = BUDGET_S) -> dict:
    """Time the model's forwards here and fit the scale and premium: the profile a store keeps (its `samples` are
    (rows, width, seconds))."""
    started, samples = time.perf_counter(), []
    _batch_samples(model, BATCHES[0])  # discarded: a process's first forwards run slow (allocations, kernel choice)
    for rows in BATCHES:
        if samples and time.perf_counter() - started + _expected_seconds(samples, rows) > budget_s:
            break
        samples += _batch_samples(model, rows)
    scale, premium = fitted(samples)
    return {
        "scale": scale, "premium": premium, "samples": [list(sample) for sample in samples], "context": CONTEXT,
        "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


class ProfileStore(Protocol):
    """Where measured profiles are kept, per device and model: the installed package's file
    (`cost_profiles/store.py`, set as `STORE` when the package is imported). Remote code exported to the Hub reads
    and writes no file, so it has none: there `"auto"` is the declared scale and `"measure"` keeps nothing."""

    def read(self, model: PreTrainedModel) -> dict | None: ...

    def write(self, model: PreTrainedModel, profile: dict) -> str:
        """Keep `profile` for the model's device and model; returns where."""

    def location(self) -> str: ...


STORE: ProfileStore | None = None
"""The profile store this process uses, if any."""


def stored_or_measured(model: PreTrainedModel) -> dict:
    """The profile stored for this device and model, else one measured now and stored."""
    profile = STORE.read(model) if STORE is not None else None
    if profile is None:
        profile = measure_profile(model)
        if STORE is not None:
            STORE.write(model, profile)
    return profile


def chosen_cost(model: PreTrainedModel, setting: float | str | None) -> tuple[ForwardCost, str]:
    """The cost model a call with `wedlm_forward_scale=setting` prices with, and where it came from: the scale
    given (no premium), the profile stored for this device and model (measured first with "measure"), or the device
    type's declared model ("declared", or "auto" where no profile is stored)."""
    device_type = model.device.type
    if setting not in (None, *CHOICES):
        return ForwardCost.declared(device_type, setting), "given by wedlm_forward_scale"
    if setting != "declared":
        profile = stored_or_measured(model) if setting == "measure" else STORE and STORE.read(model)
        if profile:
            where = "" if STORE is None else f" (stored in {STORE.location()})"
            cost = ForwardCost.declared(device_type, profile["scale"], profile.get("premium", 0.0))
            return cost, f"measured here on {profile['measured']}{where}"
    return ForwardCost.declared(device_type), f"declared for {device_type}"
