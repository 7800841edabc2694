"""Refusals in the process that takes requests, before anything runs: a model WeDLM drafting cannot serve (when
the engine starts), sampling on vLLM's CPU backend (per request), where every speculative method returns wrong
text in vLLM 0.32 (greedy is right), and a malformed per-request option. vLLM has no hook for a proposer to check
requests (custom logits processors, which have one, are refused with speculative decoding), so `InputProcessor`
is wrapped."""

import functools

from .options import DRAFTER_MODULE, REQUEST_SLOTS, DrafterOptions


def drafter_options(vllm_config) -> DrafterOptions | None:
    """The WeDLM drafter's options if `vllm_config` speculates with it, else None."""
    speculative = vllm_config.speculative_config
    path = getattr(speculative, "model", None) or ""
    if getattr(speculative, "method", None) != "custom_class" or not path.startswith(DRAFTER_MODULE + "."):
        return None
    return DrafterOptions.from_class_name(path.rpartition(".")[2])


def request_slots(params) -> int | None:
    """The request's own cap on draft tokens per forward (`extra_args={"wedlm_slots": N}`), or None."""
    return (getattr(params, "extra_args", None) or {}).get(REQUEST_SLOTS)


def request_refusal(params, on_cpu: bool, budget: int) -> str | None:
    """Why a request cannot run (a sampled request on the CPU backend, a malformed `wedlm_slots`), or None. The
    message names only what the request sent: a request that leaves `temperature` out samples at vLLM's default."""
    slots = request_slots(params)
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= budget):
        return (
            f"extra_args {REQUEST_SLOTS}={slots!r}: give an int from 0 (no WeDLM drafting for this request) to "
            f"{budget} (the server's num_speculative_tokens)"
        )
    temperature = getattr(params, "temperature", 0.0)
    if on_cpu and temperature is not None and temperature > 0:
        return (
            "this request samples (temperature > 0, vLLM's default when a request sets none), and vLLM's CPU "
            "backend returns wrong text when sampling with any speculative decoding: send temperature=0, or make "
            "greedy the server's default with --override-generation-config '{\"temperature\": 0}'"
        )
    return None


def install_request_checks() -> None:
    """Wrap `InputProcessor.__init__` (model checks) and `_validate_params` (sampling); once per process."""
    from vllm.exceptions import VLLMValidationError
    from vllm.platforms import current_platform
    from vllm.v1.engine.input_processor import InputProcessor

    from .config import check_model

    if getattr(InputProcessor, "_wedlm_checks", False):
        return
    init, validate = InputProcessor.__init__, InputProcessor._validate_params

    @functools.wraps(init)
    def checked_init(self, vllm_config, *args, **kwargs):
        options = drafter_options(vllm_config)
        if options is not None:
            model_config = vllm_config.model_config
            check_model(model_config.hf_config, list(model_config.architectures), options)
        init(self, vllm_config, *args, **kwargs)

    @functools.wraps(validate)
    def checked_validate(self, params, *args, **kwargs):
        budget = self.vllm_config.speculative_config and self.vllm_config.speculative_config.num_speculative_tokens
        refusal = drafter_options(self.vllm_config) and request_refusal(params, current_platform.is_cpu(), budget)
        if refusal:
            raise VLLMValidationError(refusal)  # a client error: the OpenAI server answers 400
        return validate(self, params, *args, **kwargs)

    InputProcessor.__init__, InputProcessor._validate_params = checked_init, checked_validate
    InputProcessor._wedlm_checks = True
