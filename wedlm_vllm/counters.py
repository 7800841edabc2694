"""The drafter's counters, read through vLLM's `collective_rpc` (which reaches the workers, in whatever process
they run, only through a method of the worker)."""

COUNTERS = ("forwards", "tokens", "drafted", "accepted", "mask_slots")
"""Summed over requests: forwards (one per request per forward that gave it tokens), tokens returned (those vLLM
accepted, up to the request's `max_tokens` and first stop token), drafts verified (mask slots not counted), drafts
accepted, mask slots fed."""


def zeroed() -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0)


def wedlm_stats(worker, reset: bool = False) -> dict[str, int]:
    """A worker's WeDLM counters (zero where it has no WeDLM drafter), optionally zeroed after reading, and the
    `forward_scale` it prices with (tokens a step carries for the price of its fixed part; 0 without a drafter)."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    stats = getattr(drafter, "stats", None)
    if stats is None or set(stats) != set(COUNTERS):
        return dict(zeroed(), forward_scale=0)
    if reset:
        drafter.stats = zeroed()
    return dict(stats, forward_scale=drafter.scale)


def install_worker_method() -> None:
    """`collective_rpc("wedlm_stats")` on every vLLM worker."""
    from vllm.v1.worker.worker_base import WorkerBase

    WorkerBase.wedlm_stats = wedlm_stats
