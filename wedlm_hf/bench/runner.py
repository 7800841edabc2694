"""Runs the arms on the same model, prompts and machine, interleaved so load drift hits every arm alike.

Per prompt set: a warm-up decode per arm; one *instrumented* pass (forward hooks, RSS sampler) that yields outputs,
forwards, the time per forward inside the model and around it, p_cache, memory and agreement; then `repeats` *timed*
passes with nothing attached, where each prompt runs every arm back to back in an order rotated per prompt and
repeat. Speeds are medians over repeats; speed-ups are medians of per-repeat ratios (paired, so drift between
repeats cancels). Arms that draft from the engine's history start each pass with a fresh one that has answered the
set's primed prompts (what a server saw before; untimed, uncounted), then keep it across the pass's prompts.
"""

import statistics
import time
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transformers import PreTrainedModel

from ..generation.settings import DEFAULT_WINDOW_SIZE
from ..generation.validation import position_limit_error
from .arms import BASELINE, COMPILED_FAMILIES, FAMILIES, Arm, Decoded, build_arms, check_families
from .measure import ForwardCounter, RssSampler, cost_model_info, machine_info

logger = logging.getLogger(__name__)
"""Says which time-vs-length lengths a model's positions rule out (one line, also on the command line)."""

SCALING_LENGTHS = (64, 128, 256, 512, 1024)
SCALING_FAMILIES = ("ar", "wedlm", "nocache")


@dataclass
class BenchConfig:
    max_new_tokens: int = 128
    repeats: int = 3
    thresholds: tuple[float | None, ...] = (0.1, 0.2, 0.4, 0.8, 1.6)
    families: tuple[str, ...] | None = None
    """Arm families to run (None: all of `arms.FAMILIES`)."""
    scaling_lengths: tuple[int, ...] = SCALING_LENGTHS
    """Generated lengths of the time-vs-length run (empty: skip it); EOS is disabled there."""
    scaling_families: tuple[str, ...] = SCALING_FAMILIES
    compile_backend: str | None = None
    """`torch.compile` backend of the compiled arms (`arms.COMPILED_FAMILIES`); None: no compiled arms."""

    def __post_init__(self):
        if self.families is not None:  # before a model loads
            check_families(self.families)


@dataclass
class ArmResult:
    arm: str
    family: str
    threshold: float | None | str
    tokens_per_s: float
    speedup: float | None
    generated: int
    forwards: int
    tokens_per_forward: float
    p_cache: float | None
    peak_rss_mib: float
    rss_growth_mib: float
    identical: float | None
    token_match: float | None
    forward_ms: float = 0.0
    """Milliseconds per forward inside the model's forward, in the instrumented pass (one pass, not a median)."""
    rest_ms: float = 0.0
    """Milliseconds per forward outside it in that pass: the method's own work (drafting, verifying, its loop)."""
    tokens_per_s_repeats: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    """The continuation of every prompt (instrumented pass), for quality checks beyond agreement with ar."""
    wedlm_totals: dict[str, int] | None = None
    """WeDLM arms: the counts of `WeDLMStats.summary()` summed over the prompts (lossless: drafted, accepted)."""


@dataclass
class BenchResult:
    config: BenchConfig
    machine: dict
    sets: dict[str, list[ArmResult]]
    scaling: dict[str, dict[int, float]]
    """Arm -> generated length -> median seconds of one decode."""
    forward_cost: dict = field(default_factory=dict)
    """The cost model lossless mode priced its widths with (`measure.cost_model_info`)."""


def _rotated(items: Sequence, shift: int) -> list:
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def agreement(outputs: list[list[int]], baseline: list[list[int]]) -> tuple[float, float]:
    """Share of identical continuations, and their mean token match: per pair, the positions i where both hold
    the same token, over the longer one's length (positionwise, so a shifted token counts as a mismatch)."""
    identical = sum(a == b for a, b in zip(outputs, baseline)) / len(outputs)
    match = [
        sum(x == y for x, y in zip(a, b)) / max(len(a), len(b), 1) for a, b in zip(outputs, baseline)
    ]
    return identical, sum(match) / len(match)


def _summed_counts(decoded: list[Decoded]) -> dict[str, int] | None:
    """The integer counts of the WeDLM stats summaries summed over the prompts; None for arms without stats."""
    if any(d.stats is None for d in decoded):
        return None
    keys = [key for key, value in decoded[0].stats.items() if isinstance(value, int)]
    return {key: sum(d.stats[key] for d in decoded) for key in keys}


def _p_cache(decoded: list[Decoded], prompts: list[list[int]], counter: ForwardCounter) -> float:
    """Spec §3's generated/processed; for arms without WeDLM stats, processed = positions fed beyond the prompt
    plus the final token, which no forward feeds (so greedy AR scores exactly 1)."""
    generated = sum(len(d.tokens) for d in decoded)
    if all(d.stats is not None for d in decoded):
        return generated / max(sum(d.stats["processed"] for d in decoded), 1)
    processed = counter.fed - sum(len(p) for p in prompts) + len(prompts)
    return generated / max(processed, 1)


def bench_prompt_set(
    model: PreTrainedModel,
    arms: Sequence[Arm],
    prompts: list[list[int]],
    config: BenchConfig,
    tick: Callable[[], None] = lambda: None,
    primed: Sequence[Sequence[int]] = (),
) -> list[ArmResult]:
    """Warm-up, instrumented pass and timed interleaved repeats of every arm over `prompts`; `primed`: the prompts
    the history arms have answered before each pass."""
    for arm in arms:
        arm.decode(model, prompts[0], min(config.max_new_tokens, 32), exact_length=False)
        tick()

    outputs, measured = {}, {}
    for arm in arms:
        arm = arm.serving(model, primed, config.max_new_tokens)
        with ForwardCounter(model) as counter, RssSampler() as rss:
            start = time.perf_counter()
            decoded = [arm.decode(model, p, config.max_new_tokens, exact_length=False) for p in prompts]
            wall = time.perf_counter() - start
            for _ in prompts:
                tick()
        outputs[arm.name] = [d.tokens for d in decoded]
        measured[arm.name] = (counter, rss, wall, _p_cache(decoded, prompts, counter), _summed_counts(decoded))

    seconds = {arm.name: [0.0] * config.repeats for arm in arms}
    tokens = {arm.name: [0] * config.repeats for arm in arms}
    for repeat in range(config.repeats):
        serving = [arm.serving(model, primed, config.max_new_tokens) for arm in arms]
        for index, prompt in enumerate(prompts):
            for arm in _rotated(serving, repeat * len(prompts) + index):
                start = time.perf_counter()
                decoded = arm.decode(model, prompt, config.max_new_tokens, exact_length=False)
                seconds[arm.name][repeat] += time.perf_counter() - start
                tokens[arm.name][repeat] += len(decoded.tokens)
                tick()
    speeds = {name: [t / s for t, s in zip(tokens[name], seconds[name])] for name in seconds}

    results = []
    for arm in arms:
        counter, rss, wall, p_cache, totals = measured[arm.name]
        generated = sum(len(t) for t in outputs[arm.name])
        identical, token_match = agreement(outputs[arm.name], outputs[BASELINE]) if BASELINE in outputs else (None, None)
        speedup = (
            statistics.median(a / b for a, b in zip(speeds[arm.name], speeds[BASELINE])) if BASELINE in speeds else None
        )
        results.append(
            ArmResult(
                arm=arm.name,
                family=arm.family,
                threshold=arm.threshold,
                tokens_per_s=statistics.median(speeds[arm.name]),
                speedup=speedup,
                generated=generated,
                forwards=counter.calls,
                tokens_per_forward=generated / max(counter.calls, 1),
                forward_ms=1000 * counter.seconds / max(counter.calls, 1),
                rest_ms=1000 * (wall - counter.seconds) / max(counter.calls, 1),
                p_cache=p_cache,
                peak_rss_mib=rss.peak / 2**20,
                rss_growth_mib=rss.growth / 2**20,
                identical=identical,
                token_match=token_match,
                tokens_per_s_repeats=speeds[arm.name],
                outputs=outputs[arm.name],
                wedlm_totals=totals,
            )
        )
    return results


def time_vs_length(
    model: PreTrainedModel,
    arms: Sequence[Arm],
    prompt: list[int],
    lengths: Sequence[int],
    repeats: int,
    tick: Callable[[], None] = lambda: None,
) -> dict[str, dict[int, list[float]]]:
    """Seconds of one decode of exactly `length` new tokens (EOS disabled), per arm, length and repeat.

    Within a repeat every arm and length runs once, in a rotated order, so sample r of two arms is a fair pair.
    """
    for arm in arms:
        arm.decode(model, prompt, min(lengths), exact_length=True)
        tick()
    samples = {arm.name: {length: [] for length in lengths} for arm in arms}
    for repeat in range(repeats):
        for index, length in enumerate(lengths):
            for arm in _rotated(arms, repeat + index):
                start = time.perf_counter()
                decoded = arm.decode(model, prompt, length, exact_length=True)
                samples[arm.name][length].append(time.perf_counter() - start)
                if len(decoded.tokens) != length:
                    raise RuntimeError(f"{arm.name} produced {len(decoded.tokens)} tokens, expected exactly {length}")
                tick()
    return samples


def run_bench(
    model: PreTrainedModel,
    prompt_sets: dict[str, list[list[int]]],
    config: BenchConfig = BenchConfig(),
    progress: bool = True,
    primed: dict[str, list[list[int]]] | None = None,
) -> BenchResult:
    """Benchmark every arm on every prompt set, then time vs generated length; see the module docstring.
    `primed`: set name -> the prompts the history arms answer before that set's (`prompts.primed_prompts`)."""
    from tqdm.auto import tqdm

    primed = primed or {}
    if set(primed) - set(prompt_sets):
        raise ValueError(f"`primed` names sets not benchmarked: {sorted(set(primed) - set(prompt_sets))}")
    scaling_prompt = min(next(iter(prompt_sets.values())), key=len)
    lengths = _fitting_lengths(model, len(scaling_prompt), config.scaling_lengths)
    compiled = _compile_options(model, prompt_sets, config, lengths) if config.compile_backend else None
    arms = build_arms(config.families or tuple(FAMILIES), config.thresholds, compiled)
    scaling_families = config.scaling_families + (tuple(COMPILED_FAMILIES) if compiled else ())
    scaling_arms = [a for a in arms if a.name in scaling_families] if lengths else []
    total = sum(len(arms) * (1 + len(p) * (1 + config.repeats)) for p in prompt_sets.values())
    total += len(scaling_arms) * (1 + len(lengths) * config.repeats)
    with tqdm(total=total, desc="bench", unit="decode", disable=not progress) as bar:
        sets = {
            name: bench_prompt_set(model, arms, prompts, config, bar.update, primed.get(name, ()))
            for name, prompts in prompt_sets.items()
        }
        samples = time_vs_length(model, scaling_arms, scaling_prompt, lengths, config.repeats, bar.update)
    scaling = {name: {n: statistics.median(s) for n, s in by_length.items()} for name, by_length in samples.items()}
    return BenchResult(config, machine_info(), sets, scaling, cost_model_info(model))



def _compile_options(
    model: PreTrainedModel, prompt_sets: dict[str, list[list[int]]], config: BenchConfig, lengths: Sequence[int]
) -> dict:
    """The keywords both compiled arms get: one `CompileConfig` (CUDA graphs with inductor, transformers' default
    mode) and a `max_cache_len` for the longest prompt and output plus a WeDLM step's width, so no call recompiles."""
    from transformers import CompileConfig

    backend = config.compile_backend
    compile_config = CompileConfig(backend=backend, mode="reduce-overhead" if backend == "inductor" else None)
    compile_config._compile_all_devices = True  # transformers compiles AR decoding only on accelerators otherwise
    window_size = getattr(model.generation_config, "wedlm_window_size", None) or DEFAULT_WINDOW_SIZE
    longest_prompt = max(len(p) for prompts in prompt_sets.values() for p in prompts)
    longest_output = max((config.max_new_tokens, *lengths))
    return {"compile_config": compile_config, "max_cache_len": longest_prompt + longest_output + 2 * window_size}


def _fitting_lengths(model: PreTrainedModel, prompt_length: int, lengths: Sequence[int]) -> tuple[int, ...]:
    """The lengths that fit the model's positions after the prompt (decoding refuses the others); warns on drops."""
    fitting = tuple(n for n in lengths if position_limit_error(model, prompt_length, n) is None)
    if len(fitting) < len(lengths):
        longest = max(set(lengths) - set(fitting))
        logger.warning(
            f"time vs length: skipping lengths {sorted(set(lengths) - set(fitting))}: "
            f"{position_limit_error(model, prompt_length, longest)}"
        )
    return fitting
