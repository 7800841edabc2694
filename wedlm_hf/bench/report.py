"""Renders a `BenchResult`: markdown tables for stdout, JSON for machines, a PNG with the two figures."""

import json
from dataclasses import asdict
from pathlib import Path

from .arms import threshold_label
from .runner import BenchResult


def _number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(result: BenchResult) -> str:
    """One table per prompt set, then the time-vs-length table. "ms/forward: model + rest" splits the instrumented
    pass's time per forward into the model's forward and the method's own work around it."""
    parts = [
        f"machine: {result.machine['cpu']}, {result.machine['logical_cores']} logical cores, "
        f"torch threads {result.machine['torch_threads']}, load average {result.machine['load_average'][0]:.2f}; "
        f"max_new_tokens={result.config.max_new_tokens}, median of {result.config.repeats} interleaved repeats"
    ]
    header = (
        "| arm | tokens/s | speed-up vs ar | forwards | tokens/forward | ms/forward: model + rest | p_cache "
        "| peak RSS MiB (+growth) | identical to ar | token match |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for name, rows in result.sets.items():
        lines = [f"\n### prompts: {name}\n", header]
        for r in rows:
            lines.append(
                f"| {r.arm} | {r.tokens_per_s:.1f} | {_number(r.speedup)} | {r.forwards} | {r.tokens_per_forward:.2f} "
                f"| {r.forward_ms:.2f} + {r.rest_ms:.2f} | {_number(r.p_cache, 3)} | {r.peak_rss_mib:.0f} "
                f"(+{r.rss_growth_mib:.0f}) | {_number(r.identical)} | {_number(r.token_match)} |"
            )
        parts.append("\n".join(lines))
    if result.scaling:
        lengths = sorted(next(iter(result.scaling.values())))
        lines = [
            "\n### seconds per decode vs generated length (EOS off); ms/token in parentheses\n",
            "| arm | " + " | ".join(str(n) for n in lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        for arm, by_length in result.scaling.items():
            cells = " | ".join(f"{by_length[n]:.2f} ({1000 * by_length[n] / n:.1f})" for n in lengths)
            lines.append(f"| {arm} | {cells} |")
        parts.append("\n".join(lines))
    if result.forward_cost:
        parts.append(cost_model_markdown(result.forward_cost))
    return "\n".join(parts) + "\n"


def cost_model_markdown(cost: dict) -> str:
    """The forward cost model's table (`measure.cost_model_info`): what lossless mode's widths were priced with,
    beside what a profile measured here (`measure.measured_cost_info`, where bench ran one) and the declared scale."""
    widths, plain = cost["widths"], cost["plain_loses_from"]
    measured = cost.get("measured") or {}
    scales = [f"the decoder prices with scale {cost['scale']:g} tokens, premium {cost['premium']:g}, {cost['source']}"]
    if cost["scale"] != cost["declared_scale"]:
        scales.append(f"declared {cost['declared_scale']:g}")
    if measured:
        scales.append(f"this run's profile fits {cost['measured_scale']:g}, premium {cost['measured_premium']:g}")
    scales.append(
        f"a wider forward's premium and a verifying step's own work ({cost['verify_share']:g}) are shares of the fixed "
        "part"
    )
    lines = [
        f"\n### forward cost model ({cost['device']}: {'; '.join(scales)}; generation/forward_cost.py)\n",
        "a forward of n tokens per row as a multiple of a one-token forward at the same batch size: "
        + ("measured by this run's profile, " if measured else "")
        + "as the decoder prices it and as the declared scale does; plain WeDLM's "
        + f"{cost['window_size']}-slot window "
        + ("pays at every batch size" if plain is None else f"costs more than it commits from batch {plain}") + "\n",
        "| batch | tokens per row | " + " | ".join(str(width) for width in widths) + " |",
        "|---|---|" + "---|" * len(widths),
    ]
    for rows, priced in cost["relative"].items():
        for label, relative in (
            ("measured", measured.get(rows)),
            (f"priced (scale {cost['scale']:g}, premium {cost['premium']:g})", priced),
            (f"declared (scale {cost['declared_scale']:g})", cost["declared"][rows]),
        ):
            if relative is not None:
                lines.append(f"| {rows} | {label} | " + " | ".join(f"{value:.2f}" for value in relative) + " |")
    return "\n".join(lines)


def write_json(result: BenchResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(asdict(result), indent=2) + "\n", encoding="utf-8")


def plot(result: BenchResult, path: str | Path) -> None:
    """(a) tokens/s vs agreement with ar per threshold, wedlm and wedlm_blockwise; (b) time vs generated length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curve, scaling) = plt.subplots(1, 2, figsize=(12, 4.5))
    for set_name, rows in result.sets.items():
        for family, marker in (("wedlm", "o"), ("wedlm_blockwise", "s")):
            swept = [r for r in rows if r.family == family and r.threshold != "default" and r.token_match is not None]
            if not swept:
                continue
            swept.sort(key=lambda r: -1.0 if r.threshold is None else r.threshold)
            label = f"{family} ({set_name})"
            curve.plot([r.token_match for r in swept], [r.tokens_per_s for r in swept], marker=marker, label=label)
            for r in swept:
                curve.annotate(threshold_label(r.threshold), (r.token_match, r.tokens_per_s), fontsize=7)
        baseline = next((r for r in rows if r.arm == "ar"), None)
        if baseline is not None:
            curve.axhline(baseline.tokens_per_s, linestyle=":", color="gray", label=f"ar ({set_name})")
    curve.set(xlabel="token match with ar", ylabel="tokens/s", title="(a) speed vs agreement per entropy threshold")
    curve.legend(fontsize=7)
    for arm, by_length in result.scaling.items():
        lengths = sorted(by_length)
        scaling.plot(lengths, [by_length[n] for n in lengths], marker="o", label=arm)
    scaling.set(xlabel="generated tokens", ylabel="seconds per decode", title="(b) time vs generated length")
    scaling.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
