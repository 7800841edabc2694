"""The default decoding an output's own evaluation.json shows right, computed by the tests independently of
`wedlm_hf.evaluation.choose_default_decoding`, and what the output's generation_config.json holds."""

import json
from pathlib import Path


def shown_right(output: Path, plain_allowed: bool = True) -> dict:
    """The default decoding the output's evaluation.json shows right, computed here from its rows: plain at the
    threshold with the most tokens per forward among those identical to greedy on every prompt, if it beats
    lossless with and without prompt lookup; else the faster of those two (without lookup on a tie). A draft-only
    adapter (`plain_allowed` False) gets the faster lossless decoding."""
    evaluation = json.loads((output / "evaluation.json").read_text())

    def tokens_per_forward(decoding: str) -> float:
        rows = [row for row in evaluation["rows"] if row["decoding"] == decoding]
        return sum(row["generated"] for row in rows) / sum(row["forwards"] for row in rows)

    lookup = tokens_per_forward("lossless+lookup") > tokens_per_forward("lossless")
    fastest_exact = max(tokens_per_forward("lossless+lookup"), tokens_per_forward("lossless"))
    identical = [
        t for t in evaluation["settings"]["thresholds"]
        if all(row["identical"] == 1.0 for row in evaluation["rows"] if row["decoding"] == f"wedlm@{t:g}")
    ]
    best = max(identical, key=lambda t: tokens_per_forward(f"wedlm@{t:g}"), default=None)
    if plain_allowed and best is not None and tokens_per_forward(f"wedlm@{best:g}") > fastest_exact:
        return {"wedlm_lossless": False, "wedlm_prompt_lookup": False, "wedlm_entropy_threshold": best}
    return {"wedlm_lossless": True, "wedlm_prompt_lookup": lookup}


def written_default(output: Path, expected: dict) -> dict:
    """The keywords of `expected` as the output's generation_config.json holds them."""
    config = json.loads((output / "generation_config.json").read_text())
    return {keyword: config.get(keyword) for keyword in expected}
