"""`wedlm-hf evaluate`: how well a model decodes in parallel on its domains, and how far it drifted elsewhere.

`evaluate_model` measures lossless and plain WeDLM against the same model's greedy `generate()`, per prompt domain,
and greedy drift from a base model; `humaneval` runs HumanEval pass@1 per decoding; `harness` runs
lm-evaluation-harness with WeDLM through its `gen_kwargs`; `choose_default_decoding` turns a report into the default
decoding a trained model's generation config gets.
"""

from .default_decoding import DefaultDecoding, choose_default_decoding
from .evaluate import DEFAULT_THRESHOLDS, evaluate_model
from .prompts import EvalPrompt, read_prompts
from .report import GREEDY, LOSSLESS, LOSSLESS_LOOKUP, DecodingRow, Drift, EvaluationReport, plain_name

__all__ = [
    "DEFAULT_THRESHOLDS",
    "GREEDY",
    "LOSSLESS",
    "LOSSLESS_LOOKUP",
    "DecodingRow",
    "DefaultDecoding",
    "Drift",
    "EvalPrompt",
    "EvaluationReport",
    "choose_default_decoding",
    "evaluate_model",
    "plain_name",
    "read_prompts",
]
