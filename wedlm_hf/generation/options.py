"""The WeDLM options, declared once: the `generate` keyword (also the `GenerationConfig` attribute), its default,
what a value must be, its help text, and where besides `generate` it is exposed.

`WeDLMSettings.resolve` checks values with the table's `Accepts`; the command line (`generate`, its `--input` batch
mode, `serve`), batch rows, `serve`'s generation defaults, the demo and `finetune`'s written generation config all
read the table, so an option is added (or renamed) here and nowhere else. Every other name derives from the one
keyword: the `WeDLMSettings` field drops the `wedlm_` prefix, the command-line flag is that field with dashes.
"""

from dataclasses import dataclass
from numbers import Integral, Real

# Where an option is exposed besides `generate` and the generation config (`WeDLMOption.exposed`).
CLI = "cli"
"""A flag of `wedlm-hf generate` (single prompt and `--input`) and, with `SERVE`, of `wedlm-hf serve`."""
ROWS = "rows"
"""A key a batch row may set for itself."""
SERVE = "serve"
"""A generation config attribute `serve` may set for every request."""
DEMO = "demo"
"""A control of the demo page, which starts from the checkpoint's value."""
FINETUNE = "finetune"
"""A `FinetuneOptions` field that `finetune` writes to the output's generation config."""

KINDS = {"int": "an integer", "number": "a number", "str": "a string"}


@dataclass(frozen=True)
class Accepts:
    """What a value must be: a kind ('int', 'number', 'bool' or 'str'), an optional lower bound, whether None is
    legal (and what it means), and named choices (a 'str' option's only values; beside a number, legal too).
    Calling it checks a value; `parse` reads command-line text."""

    kind: str
    minimum: float | None = None
    none_means: str | None = None
    """What None stands for, if None is legal."""
    choices: tuple = ()

    def __call__(self, value: object) -> bool:
        if value is None:
            return self.none_means is not None
        if value in self.choices:
            return True
        if self.choices and self.kind == "str":
            return False
        if isinstance(value, bool) or self.kind == "bool":
            return isinstance(value, bool) and self.kind == "bool"
        kind = {"int": Integral, "number": Real, "str": str}[self.kind]
        return isinstance(value, kind) and (self.minimum is None or value >= self.minimum)

    def describe(self, spelling: str = "python") -> str:
        """The rule in words, spelling None, True and False as Python does, as JSON does (`"json"`) or as the
        command line reads them (`"cli"`: 'none')."""
        choices = " or ".join(repr(choice) for choice in self.choices)
        if self.choices and self.kind == "str":
            text = choices
        elif self.kind == "bool":
            text = "True or False" if spelling == "python" else "true or false"
        else:
            text = KINDS[self.kind] + ("" if self.minimum is None else f" >= {self.minimum:g}")
            text += f" or {choices}" if choices else ""
        none = {"python": "None", "json": "null", "cli": "'none'"}[spelling]
        return text if self.none_means is None else f"{text}, or {none} for {self.none_means}"

    def parse(self, text: str) -> object:
        """A command-line value of the right kind ('none' is None where None is legal), else ValueError; calling
        the `Accepts` checks its bounds."""
        if self.none_means is not None and text.strip().lower() == "none":
            return None
        if text.strip() in self.choices:
            return text.strip()
        return {"int": int, "number": float, "str": str}[self.kind](text)


@dataclass(frozen=True)
class WeDLMOption:
    keyword: str
    """The `generate` keyword, and the generation config attribute read when the call does not pass it."""
    default: object
    accepts: Accepts
    help: str
    exposed: tuple[str, ...] = ()
    """Where besides `generate` it is exposed: `CLI`, `ROWS`, `SERVE`, `DEMO`, `FINETUNE`."""
    flag_off: str | None = None
    """A bool option's command-line flag that sets it False (its own flag sets it True); such an option chooses
    the decoding mode, so the command line makes its flags exclusive with the other modes' (`--ar`)."""
    old_flags: tuple[str, ...] = ()
    """Earlier command-line spellings, still accepted because the README and scripts used them."""

    @property
    def setting(self) -> str:
        """The `WeDLMSettings` field it resolves to."""
        return self.keyword.removeprefix("wedlm_")

    @property
    def flag(self) -> str:
        return "--" + self.setting.replace("_", "-")

    def checked(self, value: object) -> object:
        """`value` if legal, else ValueError naming the keyword and what it must be."""
        if not self.accepts(value):
            raise ValueError(f"`{self.keyword}` must be {self.accepts.describe()}; got {value!r}.")
        return value


OPTIONS = (
    WeDLMOption(
        "wedlm_window_size", 16, Accepts("int", minimum=1), "mask slots decoded in parallel (W)",
        exposed=(CLI, ROWS, SERVE, DEMO, FINETUNE),
    ),
    WeDLMOption(
        "wedlm_entropy_threshold", 0.4, Accepts("number", minimum=0, none_means="one slot per step"),
        "fill the mask slots whose position-adjusted entropy is below it (always at least one)",
        exposed=(CLI, ROWS, SERVE, DEMO, FINETUNE), old_flags=("--threshold",),
    ),
    WeDLMOption(
        "wedlm_pos_penalty_factor", 0.02, Accepts("number", minimum=0),
        "entropy added per slot of distance from the window start",
        exposed=(CLI, ROWS, SERVE, DEMO, FINETUNE), old_flags=("--penalty",),
    ),
    WeDLMOption(
        "mask_token_id", None, Accepts("int", minimum=0),
        "the mask token; else the generation or model config's `mask_token_id`", exposed=(CLI, SERVE),
    ),
    WeDLMOption(
        "wedlm_blockwise", False, Accepts("bool"),
        "the paper's block-wise baseline: a window is committed only once it is all filled", exposed=(ROWS,),
    ),
    WeDLMOption(
        "wedlm_lossless", False, Accepts("bool"),
        "WeDLM verified against the model's own greedy output (identical to it)",
        exposed=(CLI, ROWS, SERVE, DEMO, FINETUNE), flag_off="--plain",
    ),
    WeDLMOption(
        "wedlm_draft_schedule", "adaptive", Accepts("str", choices=("adaptive", "full")),
        "lossless mode's drafts per forward: follow recent acceptance, or every slot of the window",
    ),
    WeDLMOption(
        "wedlm_forward_scale", "auto",
        Accepts("number", minimum=1, none_means="'auto'", choices=("auto", "measure", "declared")),
        "the cost model's scale: the tokens a forward carries for the price of its fixed part, which prices lossless "
        "mode's draft width per batch size and plain mode's warning (generation/forward_cost.py); 'auto': the "
        "profile measured and stored for this device and model, else the declared scale; 'measure': the stored "
        "profile, else one measured now (about a second) and stored; 'declared': the device type's declared scale "
        "(generation/cost_profile.py)",
    ),
    WeDLMOption(
        "wedlm_prompt_lookup", False, Accepts("bool"),
        "lossless mode also drafts the continuation of the last n-gram where it occurred earlier in the context",
        exposed=(CLI, ROWS, SERVE),
    ),
    WeDLMOption(
        "wedlm_prompt_lookup_ngram", 2, Accepts("int", minimum=1), "prompt lookup: the longest n-gram matched",
        exposed=(CLI, ROWS),
    ),
    WeDLMOption(
        "wedlm_prompt_lookup_min_ngram", None, Accepts("int", minimum=1, none_means="2 on a CPU, 1 elsewhere"),
        "prompt lookup: the shortest n-gram matched (vLLM's `prompt_lookup_min`)",
        exposed=(CLI, ROWS),
    ),
    WeDLMOption(
        "wedlm_prompt_lookup_tokens", 10, Accepts("int", minimum=1), "prompt lookup: most tokens drafted per match",
        exposed=(CLI, ROWS),
    ),
    WeDLMOption(
        "wedlm_prompt_lookup_matches", 2, Accepts("int", minimum=1),
        "prompt lookup: earlier occurrences verified per forward as branches (the latest, the earliest, then the "
        "next latest)",
        exposed=(CLI, ROWS),
    ),
    WeDLMOption("wedlm_static", False, Accepts("bool"), "fixed-shape steps, for torch.compile / CUDA graphs"),
)

BY_SETTING = {option.setting: option for option in OPTIONS}
BY_KEYWORD = {option.keyword: option for option in OPTIONS}
KEYWORDS = tuple(BY_KEYWORD)


def exposed_to(where: str) -> tuple[WeDLMOption, ...]:
    """The options exposed to `where` (`CLI`, `ROWS`, `SERVE`, `DEMO` or `FINETUNE`), in the table's order."""
    return tuple(option for option in OPTIONS if where in option.exposed)
