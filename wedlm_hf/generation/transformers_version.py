"""The transformers versions this code runs on, checked when it is imported, and what differs between them.

Exported remote code is loaded by whatever transformers the user has; an older one fails deep inside a class
definition (4.x raises `StrictDataclassDefinitionError` on the config), so the check comes first and names the fix.

The oldest supported release, 5.19, is the newest that vLLM's CPU build (0.32) accepts; 5.25 is the newest tested.
What differs between them, by the release that changed it:
- 5.25 rewrote transformers serve (each model loads in a process of its own, and the handler and manager classes
  `wedlm-hf serve` subclasses and swaps in are gone, `split_revision` with them): refused there (`SERVING_RELEASES`);
- 5.24 renamed a model forward's `past_key_values` to `cache`: `CACHE_KEYWORD`;
- 5.24 reshaped transformers serve's classes, which `wedlm-hf serve` subclasses: refused before (`SERVING_RELEASES`);
- 5.24 gave GPT-J and CodeGen a RoPE module: refused before (generation/support.py);
- 5.23 renamed `TrainingArguments(gradient_checkpointing=)` to `activation_checkpointing`: `CHECKPOINTING_ARGUMENT`;
- 5.21 stopped extending a config's `base_model_tp_plan` on the instance (modeling/configuration_wedlm.py sets it
  there); 5.20 stopped building a default config to print or save one (configuration_wedlm.py opts out of it) and
  dropped `Cache`'s read-only `max_cache_len` (generation/kv_pool.py shadows it).
"""

import re

import transformers

TRANSFORMERS_REQUIREMENT = ">=5.19,<6"
"""The range exported code accepts (the package itself installs the tested 5.19 through 5.25);
`custom_generate/requirements.txt` is written from it."""

_MINIMUM = (5, 19)
_BELOW_MAJOR = 6


def _major_minor(version: str) -> tuple[int, int]:
    """(5, 25) from "5.25.0.dev0"; (0, 0) for a version string that does not start with two numbers."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def check_transformers_version(version: str | None = None) -> None:
    """Raise ImportError naming the supported range and the pip command unless `version` (default: the installed
    transformers) is inside `TRANSFORMERS_REQUIREMENT`."""
    version = transformers.__version__ if version is None else version
    major, minor = _major_minor(version)
    if (major, minor) < _MINIMUM or major >= _BELOW_MAJOR:
        raise ImportError(
            f"WeDLM needs transformers{TRANSFORMERS_REQUIREMENT}, but transformers {version} is installed. "
            f"Run: pip install 'transformers{TRANSFORMERS_REQUIREMENT}'"
        )


INSTALLED = _major_minor(transformers.__version__)

CACHE_KEYWORD = "cache" if INSTALLED >= (5, 24) else "past_key_values"
"""The keyword a model's forward takes its cache by: transformers 5.24 renamed `past_key_values` to `cache` (the old
name still works there, with a deprecation warning; 5.23 and older ignore `cache`)."""

CHECKPOINTING_ARGUMENT = "activation_checkpointing" if INSTALLED >= (5, 23) else "gradient_checkpointing"
"""`TrainingArguments`' switch for recomputing activations in the backward pass: 5.23 renamed
`gradient_checkpointing` (a deprecated alias from then on)."""

SERVING_RELEASES = ((5, 24), (5, 24))
"""The oldest and newest releases whose transformers serve `wedlm-hf serve` builds on: it subclasses its handlers
and model manager as 5.24 shapes them, and 5.25 rewrote them."""


def require_transformers(releases: tuple[tuple[int, int], tuple[int, int]], feature: str, extra: str = "") -> None:
    """Raise ImportError naming `feature`, the releases it runs on and the pip command when the installed
    transformers is outside `releases` (oldest, newest) (`extra`: the transformers extra the feature installs,
    e.g. "[serving]")."""
    oldest, newest = releases
    if not oldest <= INSTALLED <= newest:
        span = f"{oldest[0]}.{oldest[1]}" + ("" if oldest == newest else f" through {newest[0]}.{newest[1]}")
        raise ImportError(
            f"{feature} runs on transformers {span}, but transformers {transformers.__version__} is installed. "
            f"Run: pip install 'transformers{extra}=={newest[0]}.{newest[1]}.*'"
        )
