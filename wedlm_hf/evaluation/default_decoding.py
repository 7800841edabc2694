"""The default decoding a trained or fine-tuned model's generation config gets: the one its own evaluation showed to
be right, or the user's explicit choice.

Plain WeDLM commits the model's own mask predictions, so after a short run it may decode garbage; lossless WeDLM's
output is the greedy output by construction. `wedlm-hf finetune` and `wedlm-hf train` both decide here and rewrite
the output's `generation_config.json` here.
"""

from dataclasses import dataclass
from pathlib import Path

from transformers import GenerationConfig

from ..draft_adapter import record_decoding_defaults
from ..generation.options import BY_SETTING
from .evaluate import DEFAULT_THRESHOLDS
from .report import LOSSLESS, LOSSLESS_LOOKUP, EvaluationReport, plain_name

LOSSLESS_OPTION = BY_SETTING["lossless"]
"""`wedlm_lossless`, whose `--lossless` / `--plain` flags are the user's explicit choice."""
LOOKUP_KEYWORD = BY_SETTING["prompt_lookup"].keyword


@dataclass(frozen=True)
class DefaultDecoding:
    """Generation-config keywords to write, and one sentence (with the numbers) saying why."""

    keywords: dict
    reason: str

    def to_dict(self) -> dict:
        return {"keywords": dict(self.keywords), "reason": self.reason}

    def describe(self) -> str:
        """'lossless WeDLM' or 'plain WeDLM at entropy threshold T', for summaries and model cards."""
        if self.keywords[LOSSLESS_OPTION.keyword]:
            return "lossless WeDLM" + (" with prompt lookup" if self.keywords.get(LOOKUP_KEYWORD) else "")
        return f"plain WeDLM at entropy threshold {self.keywords['wedlm_entropy_threshold']:g}"

    def sentence(self) -> str:
        return f"{self.describe()} ({self.reason})"


def lossless(reason: str, lookup: bool | None = None) -> DefaultDecoding:
    """Lossless WeDLM; with `lookup` True or False, prompt lookup on or off (None: left as it is)."""
    keywords = {LOSSLESS_OPTION.keyword: True} | ({} if lookup is None else {LOOKUP_KEYWORD: lookup})
    return DefaultDecoding(keywords, reason)


def plain(threshold: float, reason: str) -> DefaultDecoding:
    """Plain WeDLM at `threshold` (prompt lookup off: it drafts for lossless mode only)."""
    return DefaultDecoding(
        {LOSSLESS_OPTION.keyword: False, LOOKUP_KEYWORD: False, "wedlm_entropy_threshold": float(threshold)}, reason
    )


def evaluated_thresholds(threshold: float | None) -> tuple[float, ...]:
    """Plain WeDLM is evaluated at the user's threshold alone (so a given one is never silently replaced), else at
    `DEFAULT_THRESHOLDS`."""
    return DEFAULT_THRESHOLDS if threshold is None else (threshold,)


def choose_default_decoding(report: EvaluationReport, plain_allowed: bool = True) -> DefaultDecoding:
    """The default decoding `report` shows to be right, and the fastest such (`plain_allowed` False: lossless, with
    or without lookup, as a draft-only adapter needs).

    Lossless WeDLM is right by construction (its output is the greedy output), with prompt lookup or without: of
    the two, the one with more tokens per forward over all domains (generated tokens summed over domains / forwards
    summed over domains; lookup only if strictly more). Plain WeDLM at threshold t is shown right only if on every
    evaluated domain its continuations are identical to greedy `generate()`'s (`identical` == 1.0). Among those
    thresholds, the one with the most tokens per forward is chosen, and only if it beats the chosen lossless
    decoding's; otherwise that lossless decoding.
    """
    domains = list(dict.fromkeys(row.domain for row in report.rows))

    def tokens_per_forward(decoding: str) -> float:
        rows = [report.row(domain, decoding) for domain in domains]
        return sum(row.generated for row in rows) / max(sum(row.forwards for row in rows), 1)

    plain_speed, lookup_speed = tokens_per_forward(LOSSLESS), tokens_per_forward(LOSSLESS_LOOKUP)
    with_lookup = lookup_speed > plain_speed
    exact = f"lossless{' with prompt lookup' if with_lookup else ''}"
    baseline = max(plain_speed, lookup_speed)
    lookup_words = f"{lookup_speed:.2f} tokens per forward with prompt lookup, {plain_speed:.2f} without"
    if not plain_allowed:
        return lossless(f"lossless only (plain would change the output); {lookup_words}", with_lookup)
    thresholds = report.settings["thresholds"]
    shown_right = [t for t in thresholds if all(report.row(d, plain_name(t)).identical == 1.0 for d in domains)]
    if not shown_right:
        worst = {t: min((report.row(d, plain_name(t)).identical, d) for d in domains) for t in thresholds}
        misses = ", ".join(f"{plain_name(t)} {share:.0%} on {d!r}" for t, (share, d) in worst.items())
        return lossless(
            f"plain WeDLM was not identical to greedy on every domain at any threshold (identical: {misses}); "
            f"lossless: {lookup_words}",
            with_lookup,
        )
    best = max(shown_right, key=lambda t: tokens_per_forward(plain_name(t)))
    speed = tokens_per_forward(plain_name(best))
    if speed <= baseline:
        return lossless(
            f"plain WeDLM at threshold {best:g} reproduced greedy on every domain but made {speed:.2f} tokens per "
            f"forward, not more than {exact}'s {baseline:.2f} (lossless: {lookup_words})",
            with_lookup,
        )
    return plain(
        best,
        f"plain WeDLM at threshold {best:g} reproduced greedy on every domain ({', '.join(map(repr, domains))}) at "
        f"{speed:.2f} tokens per forward, more than {exact}'s {baseline:.2f}",
    )


def decide_default_decoding(
    lossless_flag: bool | None, threshold: float | None, report: EvaluationReport | None
) -> DefaultDecoding:
    """The user's explicit choice (`lossless_flag` True or False), else the evaluation's, else (not evaluated)
    lossless. `threshold` is the user's entropy threshold (None: the table's default for explicit plain)."""
    if lossless_flag is True:
        return lossless(f"chosen by {LOSSLESS_OPTION.flag}")
    if lossless_flag is False:
        given = BY_SETTING["entropy_threshold"].default if threshold is None else threshold
        return plain(given, f"chosen by {LOSSLESS_OPTION.flag_off}")
    if report is None:
        return lossless("not evaluated, so lossless, whose output is the greedy output by construction")
    return choose_default_decoding(report)


def write_default_decoding(output_dir: str | Path, decoding: DefaultDecoding) -> None:
    """Rewrite `output_dir`'s generation_config.json with `decoding`'s keywords, the rest of it unchanged (a
    draft-only adapter's marker gets its decoding defaults too, for loading by PEFT or transformers)."""
    config = GenerationConfig.from_pretrained(output_dir)
    for keyword, value in decoding.keywords.items():
        setattr(config, keyword, value)
    config.save_pretrained(output_dir)
    record_decoding_defaults(output_dir)
