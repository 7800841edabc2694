"""Host syncs per decoding step: at most 2 (the loop's own exit/shape check), plain and lossless.

A CPU has no device queue to stall, so a sync is counted by patching every `Tensor` method that must read a
device value on the host (`item`, `tolist`, `cpu`, `nonzero`, `bool()`/`int()`/`float()`/`index()`, boolean-mask
indexing). Counting covers the whole decoding loop, model forwards included, with no streamer and no user
stopping criterion (each of those legitimately reads tokens on the host).
"""

import contextlib

import pytest
import torch
from tiny_models import MASK_ID, random_prompts, tiny_model

import wedlm_hf
from wedlm_hf.generation.decoding import WindowDecoder

SYNCS_PER_STEP = 2
_SYNCING_METHODS = ("item", "tolist", "cpu", "nonzero", "__bool__", "__int__", "__float__", "__index__")


def _has_bool_index(index) -> bool:
    indices = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


class SyncCounter:
    def __init__(self):
        self.count = 0
        self.active = False
        self.where: list[str] = []

    def hit(self, name: str) -> None:
        if self.active:
            self.count += 1
            self.where.append(name)

    @contextlib.contextmanager
    def patched(self, monkeypatch):
        for name in _SYNCING_METHODS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(name, original))
        original_nonzero = torch.nonzero
        monkeypatch.setattr(torch, "nonzero", self._counting("torch.nonzero", original_nonzero))
        original_getitem, original_setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__

        def getitem(tensor, index):
            if _has_bool_index(index):
                self.hit("bool-index get")
            return original_getitem(tensor, index)

        def setitem(tensor, index, value):
            if _has_bool_index(index):
                self.hit("bool-index set")
            return original_setitem(tensor, index, value)

        monkeypatch.setattr(torch.Tensor, "__getitem__", getitem)
        monkeypatch.setattr(torch.Tensor, "__setitem__", setitem)
        original_run = WindowDecoder.run

        def counted_run(decoder):
            self.active = True
            try:
                return original_run(decoder)
            finally:
                self.active = False

        monkeypatch.setattr(WindowDecoder, "run", counted_run)
        yield self

    def _counting(self, name, original):
        counter = self

        def counted(*args, **kwargs):
            was_active, counter.active = counter.active, False  # a sync inside a sync is one sync
            try:
                return original(*args, **kwargs)
            finally:
                counter.active = was_active
                counter.hit(name)

        return counted


def syncs_per_step(monkeypatch, family: str, lengths: list[int], **options) -> tuple[float, list[str]]:
    model = wedlm_hf.enable(tiny_model(family, seed=2, peak=40))
    input_ids, attention_mask = random_prompts(lengths, seed=4)
    counter = SyncCounter()
    with counter.patched(monkeypatch):
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoding="wedlm",
            mask_token_id=MASK_ID,
            max_new_tokens=40,
            return_dict_in_generate=True,
            **options,
        )
    steps = output.wedlm_stats.model_calls
    assert steps > 3
    return counter.count / steps, counter.where


@pytest.mark.parametrize("family", ["wedlm", "llama"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"wedlm_entropy_threshold": None},
        {"wedlm_entropy_threshold": 2.0, "wedlm_window_size": 6},
        {"wedlm_blockwise": True},
        {"wedlm_lossless": True},
        {"wedlm_lossless": True, "wedlm_entropy_threshold": 2.0},
    ],
)
@pytest.mark.parametrize("lengths", [[7], [5, 9, 3]])
def test_at_most_two_host_syncs_per_step(monkeypatch, family, options, lengths):
    per_step, where = syncs_per_step(monkeypatch, family, lengths, **options)
    assert per_step <= SYNCS_PER_STEP, f"{per_step:.2f} syncs per step: {sorted(set(where))}"


def test_counter_sees_a_sync(monkeypatch):
    """The counter is live: a decoding loop that reads a value on the host each step is caught."""
    original_forward = WindowDecoder._feed

    def syncing_feed(decoder, *args, **kwargs):
        for _ in range(3):
            decoder.window_length.max().item()
            bool(decoder.window_length.any())
        return original_forward(decoder, *args, **kwargs)

    monkeypatch.setattr(WindowDecoder, "_feed", syncing_feed)
    per_step, where = syncs_per_step(monkeypatch, "wedlm", [6])
    assert per_step >= 6 and "item" in where and "__bool__" in where
