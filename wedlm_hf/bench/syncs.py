"""Counting host syncs (device -> host reads) of a WeDLM decoding loop, for tests/test_syncs.py and
scripts/step_cost.py.

A CPU has no device queue to stall, so a sync is counted by patching every `Tensor` method that must read a
device value on the host (`item`, `tolist`, `cpu`, `nonzero`, `bool()`/`int()`/`float()`/`index()`, boolean-mask
indexing), while the decoding loop (`generation.loop.run` as `wedlm_decode` calls it, model forwards included)
is on the stack.
"""

import contextlib

import torch

from ..generation import decoding

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
        """Patch through `monkeypatch` (pytest's, or `Patcher` outside pytest) for as long as the context."""
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
        monkeypatch.setattr(decoding, "run", self._counted_run(decoding.run))
        yield self

    def _counted_run(self, run):
        counter = self

        def counted_run(*args, **kwargs):
            was_active, counter.active = counter.active, True
            try:
                return run(*args, **kwargs)
            finally:
                counter.active = was_active

        return counted_run

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



class Patcher:
    """The `setattr` half of pytest's monkeypatch, with `undo`, for scripts."""

    def __init__(self):
        self._saved = []

    def setattr(self, owner, name, value) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self._saved:
            owner, name, value = self._saved.pop()
            setattr(owner, name, value)
