"""Soak run: many consecutive `generate` calls of mixed sizes; RSS must stay flat and outputs must not drift.

Used by `scripts/soak.py` (1,000 calls) and by a shorter test. RSS is read from /proc (Linux) after each call.
"""

import random
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

PROMPTS = (
    "1, 2, 3, 4, 5,",
    "def add(a, b):\n",
    "for i in range(10):\n",
    "10 20 30 40",
    "import os\n",
    "class Stack:\n    def __init__(self):\n",
)


def resident_megabytes() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


@dataclass
class SoakReport:
    calls: int
    rss_after_warmup_mb: float
    rss_end_mb: float
    rss_peak_mb: float
    first_equals_last: bool

    @property
    def growth_mb(self) -> float:
        return self.rss_end_mb - self.rss_after_warmup_mb


def soak(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, calls: int, warmup: int = 20, seed: int = 0
) -> SoakReport:
    """Run `calls` WeDLM generate calls (batch 1-4, 4-48 new tokens, greedy and sampled, mixed windows)."""
    rng = random.Random(seed)
    tokenizer.padding_side = "left"
    probe = tokenizer([PROMPTS[0], PROMPTS[3]], return_tensors="pt", padding=True)

    def probe_output() -> torch.Tensor:
        return model.generate(**probe, decoding="wedlm", max_new_tokens=24, do_sample=False)

    first = probe_output()
    rss_after_warmup = peak = 0.0
    for call in range(calls - 2):
        prompts = rng.sample(PROMPTS, rng.randint(1, 4))
        inputs = tokenizer(prompts, return_tensors="pt", padding=True)
        options = {"max_new_tokens": rng.randint(4, 48), "wedlm_window_size": rng.choice([4, 8, 16])}
        if rng.random() < 0.3:
            options.update(do_sample=True, temperature=0.8, top_p=0.95)
        else:
            options.update(do_sample=False, wedlm_lossless=rng.random() < 0.3)
        model.generate(**inputs, decoding="wedlm", **options)
        rss = resident_megabytes()
        peak = max(peak, rss)
        if call == warmup:
            rss_after_warmup = rss
    last = probe_output()
    return SoakReport(calls, rss_after_warmup, resident_megabytes(), peak, bool(torch.equal(first, last)))
