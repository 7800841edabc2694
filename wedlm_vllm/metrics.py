"""vLLM's own spec-decode metrics (its periodic log line, Prometheus `vllm:spec_decode_*` on `/metrics`), made true
for WeDLM drafting.

vLLM's scheduler counts every token a request fed after its last one as a draft, so each mask slot would count as
a rejected draft and a user would read a near-zero acceptance rate. Wrapped here, in the engine-core process, the
count leaves out the mask slots: drafts are the real drafts, accepted drafts are vLLM's own count, and a forward
that fed only mask slots counts as a draft step of zero tokens, so vLLM's "mean acceptance length" (1 + accepted
per draft step) is the requests' tokens per forward while they speculate.
"""

import functools

from .schedule import mask_slots


def install_metrics() -> None:
    """Wrap `Scheduler.update_from_output` (to see the step's scheduled drafts) and `make_spec_decoding_stats`
    (to leave mask slots out); once per process, a no-op for engines that do not draft with WeDLM."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    if getattr(Scheduler, "_wedlm_metrics", False):
        return
    update_from_output, make_stats = Scheduler.update_from_output, Scheduler.make_spec_decoding_stats

    @functools.wraps(update_from_output)
    def seeing_update_from_output(self, scheduler_output, *args, **kwargs):
        self._wedlm_scheduled = scheduler_output.scheduled_spec_decode_tokens
        try:
            return update_from_output(self, scheduler_output, *args, **kwargs)
        finally:
            self._wedlm_scheduled = None

    @functools.wraps(make_stats)
    def stats_without_mask_slots(
        self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id
    ):
        masks = _mask_slots(self, request_id)
        if not masks or not self.log_stats:
            return make_stats(
                self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens, request_id
            )
        invalid = (num_invalid_spec_tokens or {}).get(request_id, 0)  # grammar cuts the tail: the mask slots first
        spec_decoding_stats = spec_decoding_stats or SpecDecodingStats.new(self.num_spec_tokens)
        spec_decoding_stats.observe_draft(
            num_draft_tokens=num_draft_tokens - max(masks, invalid), num_accepted_tokens=num_accepted_tokens
        )
        return spec_decoding_stats

    Scheduler.update_from_output = seeing_update_from_output
    Scheduler.make_spec_decoding_stats = stats_without_mask_slots
    Scheduler._wedlm_metrics = True


def _mask_slots(scheduler, request_id: str) -> int:
    """The mask slots at the end of the request's drafts in the step being recorded (0 for other drafters)."""
    mask_token_id = _mask_token_id(scheduler)
    if mask_token_id is None:
        return 0
    return mask_slots((getattr(scheduler, "_wedlm_scheduled", None) or {}).get(request_id, ()), mask_token_id)


def _mask_token_id(scheduler) -> int | None:
    """The mask id the engine's WeDLM drafter uses, or None where the engine does not draft with WeDLM."""
    if not hasattr(scheduler, "_wedlm_mask_token_id"):
        from .checks import drafter_options
        from .config import check_model

        options = drafter_options(scheduler.vllm_config)
        model_config = scheduler.vllm_config.model_config
        scheduler._wedlm_mask_token_id = (
            None
            if options is None
            else check_model(model_config.hf_config, list(model_config.architectures), options)
        )
    return scheduler._wedlm_mask_token_id
