"""`wedlm-hf bench`: decoding methods compared on one model, prompt set and machine (see `runner`)."""

from .arms import BASELINE, FAMILIES, THRESHOLD_SWEPT, Arm, build_arms
from .models import random_model
from .report import markdown, plot, write_json
from .runner import ArmResult, BenchConfig, BenchResult, run_bench, time_vs_length

__all__ = [
    "BASELINE",
    "FAMILIES",
    "THRESHOLD_SWEPT",
    "Arm",
    "ArmResult",
    "BenchConfig",
    "BenchResult",
    "build_arms",
    "markdown",
    "plot",
    "random_model",
    "run_bench",
    "time_vs_length",
    "write_json",
]
