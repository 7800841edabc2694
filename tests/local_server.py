"""`wedlm-hf serve` in a thread of the test process on 127.0.0.1; `kill_server()` stops it and removes its hooks."""

import socket
import time
from patience import PATIENCE_S

import wedlm_hf


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(generation_defaults: dict | None = None, **serve_options):
    """The running server (`kill_server()` stops it and uninstalls its hooks) and its port."""
    from wedlm_hf import serving

    port = free_port()
    running = serving.serve(
        wedlm_hf.DEFAULT_MODEL, host="127.0.0.1", port=port, generation_defaults=generation_defaults or {},
        non_blocking=True, **serve_options,
    )
    deadline = time.monotonic() + PATIENCE_S
    while not running.server.started:
        assert time.monotonic() < deadline, f"the server did not start within {PATIENCE_S} s"
        time.sleep(0.1)
    return running, port
