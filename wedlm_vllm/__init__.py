"""WeDLM's lossless mode inside vLLM: a plugin that ships with wedlm-hf.

vLLM loads `register` through the `vllm.general_plugins` entry point in every process it starts. Drafts come from
the target model's own forward: the mask slots fed after the drafts under verification predict the tokens at their
own positions, and vLLM's rejection sampler verifies every draft, so the output is exactly the model's.

This package sits beside `wedlm_hf`, not inside it: importing anything of `wedlm_hf` runs its `__init__`, which
imports torch and transformers and registers the WeDLM classes, and vLLM loads a plugin in every process it
starts. Nothing here imports vLLM or `wedlm_hf` until vLLM loads the plugin.
"""

from .options import DEFAULT_SLOTS, DrafterOptions, speculative_config

__all__ = ["DEFAULT_SLOTS", "DrafterOptions", "register", "speculative_config", "stats"]


def register() -> None:
    """The `vllm.general_plugins` entry point: model_type "wedlm" readable by vLLM, request checks installed.
    vLLM may call it several times per process; each call is idempotent."""
    from .checks import install_request_checks
    from .config import register_config
    from .counters import install_worker_method
    from .metrics import install_metrics

    register_config()
    install_request_checks()
    install_worker_method()
    install_metrics()


def stats(llm, reset: bool = False) -> dict[str, int]:
    """The drafter's own counters for an `LLM`: forwards and returned tokens of the requests it saw, drafts verified
    and accepted (mask slots not counted), mask slots fed; and the `forward_scale` it prices the batch with
    (`wedlm_vllm/cost.py`). `reset` zeroes the counters after reading."""
    return llm.collective_rpc("wedlm_stats", args=(reset,))[0]
