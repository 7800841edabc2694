"""What a bench run measures besides time: model forwards, the tokens they fed and the time inside them, each arm's
peak memory, the machine the numbers come from and the forward cost model that priced lossless mode's widths (and
what a profile measured of it here)."""

import platform
import threading
import time

import psutil
import torch
from transformers import PreTrainedModel

from ..cost_profiles.store import device_name
from ..generation.cost_profile import BATCHES, WIDTHS, chosen_cost
from ..generation.forward_cost import ForwardCost
from ..generation.mask_slots import MASK_SLOTS
from ..generation.plain import window_loses_from
from ..generation.settings import DEFAULT_WINDOW_SIZE


class ForwardCounter:
    """Counts model forwards, the query tokens they fed and the seconds spent inside them, via hooks on the
    top-level module: the rest of a decode's time is the decoding method's own work around its forwards, which
    tokens per forward do not show (on a small model it can decide which method is faster). `forwards` keeps each
    forward's (query tokens per row, whether it had mask slots, seconds) in order."""

    def __init__(self, model: PreTrainedModel):
        self.model, self.calls, self.fed, self.seconds, self._entered = model, 0, 0, 0.0, 0.0
        self.forwards: list[tuple[int, bool, float]] = []

    def _enter(self, module, args, kwargs) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls += 1
        self.fed += int(input_ids.shape[1])
        self._width, self._masked = int(input_ids.shape[1]), MASK_SLOTS.get() is not None
        self._entered = time.perf_counter()

    def _leave(self, *_) -> None:
        spent = time.perf_counter() - self._entered
        self.seconds += spent
        self.forwards.append((self._width, self._masked, spent))

    def __enter__(self) -> "ForwardCounter":
        self.handles = [
            self.model.register_forward_pre_hook(self._enter, with_kwargs=True),
            self.model.register_forward_hook(self._leave),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()


class RssSampler:
    """Peak resident set size of this process while the block runs, sampled by a thread every `interval` s.

    `ru_maxrss` is a whole-process high-water mark, useless for the second arm onwards; sampling gives each arm
    its own peak. Allocator caching means `growth` (peak minus RSS at entry) is the number to compare.
    """

    def __init__(self, interval: float = 0.005):
        self.interval, self.process = interval, psutil.Process()
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> "RssSampler":
        self.start = self.peak = self.process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


def cost_model_info(model: PreTrainedModel) -> dict:
    """The forward cost model the model's device and generation config give lossless decoding
    (`generation/forward_cost.py`): the scale and premium it prices with and where they came from
    (`cost_profile.chosen_cost`), its table of a forward of `cost_profile.WIDTHS` tokens per row as a multiple of a
    one-token forward at `cost_profile.BATCHES` beside the declared scale's, and from which batch size plain mode's
    window costs more than it commits."""
    config = model.generation_config
    cost, source = chosen_cost(model, getattr(config, "wedlm_forward_scale", None))
    declared = ForwardCost.declared(model.device.type)
    window_size = getattr(config, "wedlm_window_size", None) or DEFAULT_WINDOW_SIZE
    return {
        "device": model.device.type, "scale": cost.scale, "premium": cost.premium, "source": source,
        "verify_share": cost.verify_share,
        "widths": list(WIDTHS), "relative": dict(cost.table(BATCHES, WIDTHS)),
        "declared_scale": declared.scale, "declared": dict(declared.table(BATCHES, WIDTHS)),
        "window_size": window_size, "plain_loses_from": window_loses_from(cost, window_size),
    }


def measured_cost_info(profile: dict) -> dict:
    """What a profile (`cost_profile.measure_profile`) measured, for `cost_model_info`'s table: its fitted scale and
    premium, and each measured batch size's forwards as a multiple of its one-token forward."""
    seconds = {(rows, width): spent for rows, width, spent in profile["samples"]}
    batches = sorted({rows for rows, _ in seconds})
    return {
        "measured_scale": profile["scale"], "measured_premium": profile["premium"],
        "measured": {rows: [seconds[rows, width] / seconds[rows, 1] for width in WIDTHS] for rows in batches},
    }


def machine_info() -> dict:
    """What the numbers were measured on."""
    return {
        "cpu": device_name(torch.device("cpu")),
        "logical_cores": psutil.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(psutil.getloadavg()),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
