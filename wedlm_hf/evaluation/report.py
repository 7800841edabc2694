"""What `evaluate_model` measured, as one markdown table and as JSON (the same numbers)."""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

GREEDY, LOSSLESS, LOSSLESS_LOOKUP = "greedy", "lossless", "lossless+lookup"
"""Names of the reference decoding (transformers' greedy `generate`), lossless WeDLM, and lossless WeDLM with prompt
lookup in the report."""


def write_json(data: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def plain_name(threshold: float) -> str:
    """The report's name of plain WeDLM at one entropy threshold."""
    return f"wedlm@{threshold:g}"


@dataclass
class DecodingRow:
    """One decoding on one domain's prompts. Token match and identical compare with the same model's greedy
    output (see `wedlm_hf.bench.runner.agreement`); the speed-up is wall-clock, against greedy run interleaved."""

    domain: str
    decoding: str
    prompts: int
    generated: int
    forwards: int
    tokens_per_forward: float
    identical: float
    token_match: float
    tokens_per_s: float
    speedup: float
    drafted: int | None = None
    accepted: int | None = None
    """Lossless only: draft tokens verified, and how many of them the model's greedy choice confirmed."""

    @property
    def acceptance(self) -> float | None:
        return None if not self.drafted else self.accepted / self.drafted


@dataclass
class Drift:
    """Greedy continuations of the evaluated model against a base model's on the same general chat prompts."""

    prompts: int
    changed: int
    token_match: float
    """Mean token match with the base model's continuation (positionwise, over the longer one)."""
    continuations: list[dict] = field(default_factory=list)
    """Per prompt: the prompt, both continuations as text, and their token match."""


@dataclass
class EvaluationReport:
    settings: dict
    machine: dict
    rows: list[DecodingRow]
    drift: Drift | None = None

    def row(self, domain: str, decoding: str) -> DecodingRow:
        """The row of one domain and decoding (`GREEDY`, `LOSSLESS`, `LOSSLESS_LOOKUP` or `plain_name(threshold)`)."""
        for row in self.rows:
            if (row.domain, row.decoding) == (domain, decoding):
                return row
        raise KeyError(f"no row for domain {domain!r} and decoding {decoding!r}")

    def to_dict(self) -> dict:
        rows = [asdict(row) | {"acceptance": row.acceptance} for row in self.rows]
        return {"settings": self.settings, "machine": self.machine, "rows": rows, "drift": self.drift and asdict(self.drift)}

    def write_json(self, path: str | Path) -> None:
        write_json(self.to_dict(), path)

    def markdown(self) -> str:
        """One table: a row per domain and decoding, then the drift row against the base model, if measured."""
        lines = [
            "| prompts | decoding | tokens/forward | accepted/drafted | token match | identical | speed-up vs greedy "
            "| tokens/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            accepted = "-" if r.drafted is None else f"{r.accepted}/{r.drafted}"
            if r.drafted:
                accepted += f" ({r.acceptance:.0%})"
            lines.append(
                f"| {r.domain} ({r.prompts}) | {r.decoding} | {r.tokens_per_forward:.2f} | {accepted} | "
                f"{r.token_match:.3f} | {r.identical:.0%} | {r.speedup:.2f}x | {r.tokens_per_s:.1f} |"
            )
        if self.drift is not None:
            d = self.drift
            lines.append(
                f"| chat drift ({d.prompts}) | greedy vs base model | - | - | {d.token_match:.3f} | "
                f"{d.prompts - d.changed}/{d.prompts} unchanged | - | - |"
            )
        settings = self.settings
        lines += [
            "",
            f"Token match and identical: against this model's greedy output (chat drift: against the base model's). "
            f"At most {settings['max_new_tokens']} new tokens, speeds the median of {settings['repeats']} interleaved "
            f"repeats; machine: {self.machine['cpu']}, torch threads {self.machine['torch_threads']}.",
        ]
        return "\n".join(lines) + "\n"
