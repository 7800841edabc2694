"""`wedlm-hf serve` in a thread of the test process on 127.0.0.1, with the hooks it installs undone afterwards."""

import socket
import time

import pytest
from transformers.cli.serving import model_manager
from transformers.cli.serving import utils as serving_utils

import wedlm_hf


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(patch: pytest.MonkeyPatch, **serve_options):
    """The running server (`kill_server()` stops it) and its port; `patch.undo()` then removes serve's hooks."""
    from wedlm_hf import serving

    patch.setattr(model_manager, "ModelManager", model_manager.ModelManager)
    patch.setattr(serving_utils, "GenerationState", serving_utils.GenerationState)
    for name in ("WeDLMForCausalLM", "WeDLMModel", "WeDLMConfig"):
        patch.setattr(model_manager.transformers, name, None, raising=False)
    port = free_port()
    running = serving.serve(
        wedlm_hf.DEFAULT_MODEL, host="127.0.0.1", port=port, generation_defaults={}, non_blocking=True,
        **serve_options,
    )
    deadline = time.monotonic() + 60
    while not running.server.started:
        assert time.monotonic() < deadline, "the server did not start within 60 s"
        time.sleep(0.1)
    return running, port
