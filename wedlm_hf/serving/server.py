"""`wedlm-hf serve`: one model behind the OpenAI API (handlers.py), served by uvicorn, decoding with WeDLM: the model
is loaded as `generate` loads it, passed through `wedlm_hf.enable`, and its generation config, which every request's
is copied from, gets `decoding="wedlm"` and the server's defaults.

The server is this package's own, on FastAPI and uvicorn (the `serve` extra installs them with transformers'
serving dependencies), not `transformers serve`: that server looks a checkpoint's architecture up by name in the
`transformers` namespace and never passes `decoding`, so serving WeDLM through it meant replacing its private
classes, which 5.24 reshaped and 5.25 rewrote (each model then runs in a process of its own, out of reach of a
replaced class). This one uses transformers' public API only, on every release the package accepts.
"""

import errno
import socket
import threading
import time
from collections.abc import Callable

from transformers import PreTrainedModel, PreTrainedTokenizerBase

import wedlm_hf
from wedlm_hf.generation.options import BY_KEYWORD, SERVE, exposed_to

from .batching import BatchingEngine
from .managers import Engine, GenerateEngine

GENERATION_OPTIONS = tuple(option.keyword for option in exposed_to(SERVE))
"""Generation config attributes that `serve` may set for every request."""
SHUTDOWN_GRACE_S = 5
"""How long a stopping server waits for the answers still being written."""


def check_generation_defaults(generation_defaults: dict) -> None:
    """Raise a ValueError for a default `serve` cannot set, or a value its option refuses."""
    unknown = set(generation_defaults) - set(GENERATION_OPTIONS)
    if unknown:
        raise ValueError(f"serve cannot set {sorted(unknown)}; settable: {', '.join(GENERATION_OPTIONS)}")
    for name, value in generation_defaults.items():
        BY_KEYWORD[name].checked(value)


class Server:
    """A loaded model and its engine behind the OpenAI API on `host:port`: `run()` serves until interrupted,
    `start()` serves from a thread until `stop()`; the engine is closed when serving ends."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, name: str, engine: Engine, host: str,
        port: int, log_level: str = "warning",
    ):
        import uvicorn

        from .handlers import build_app

        self.model, self.tokenizer, self.name, self.engine = model, tokenizer, name, engine
        self.created = int(time.time())
        config = uvicorn.Config(
            build_app(self), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=SHUTDOWN_GRACE_S
        )
        self.uvicorn = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        """Whether it listens."""
        return self.uvicorn.started

    def run(self) -> None:
        try:
            self.uvicorn.run()
        finally:
            self.engine.close()

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="wedlm-serve", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(SHUTDOWN_GRACE_S * 2)


def check_port(host: str, port: int) -> None:
    """Raise an OSError saying why the server could not listen on `host:port` (busy, or no such interface), so it
    is known before anything loads (the server binds once the model is loaded)."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: only a listener blocks
            probe.bind(address)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise OSError(f"port {port} on {host} is in use (another server?): stop it, or pick another port") from None
        raise OSError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def load(
    model: str, generation_defaults: dict, device: str = "auto", dtype: str = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`model` (a name or path `from_pretrained` reads) WeDLM-enabled, with `decoding="wedlm"` and
    `generation_defaults` on its generation config."""
    from wedlm_hf.loading import load_model_and_tokenizer

    loaded, tokenizer = load_model_and_tokenizer(model, dtype=dtype, device_map=device)
    loaded = wedlm_hf.enable(loaded)
    loaded.generation_config.decoding = "wedlm"
    for name, value in generation_defaults.items():
        setattr(loaded.generation_config, name, value)
    return loaded, tokenizer


def serve(
    model: str,
    *,
    host: str,
    port: int,
    generation_defaults: dict,
    batching: dict | None = None,
    name: str | None = None,
    announce: Callable[[], None] | None = None,
    device: str = "auto",
    dtype: str = "auto",
    log_level: str = "warning",
    block: bool = True,
) -> Server:
    """Serve `model` until interrupted, or with `block=False` from a thread (stop it with the returned server's
    `stop()`); with `batching` (`BatchingEngine`'s options: max_batch_size, max_batch_tokens, draft_history),
    requests are continuously batched by WeDLM's scheduler. `name` (default: `model`) is the model id clients
    send, `/v1/models` lists and responses name. An OSError says so at once if the port cannot be listened on;
    `announce` is called once it can, before the model loads."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ImportError("`wedlm-hf serve` needs FastAPI and uvicorn: pip install 'wedlm-hf[serve]'") from None
    check_generation_defaults(generation_defaults)
    check_port(host, port)
    if announce is not None:
        announce()
    loaded, tokenizer = load(model, generation_defaults, device, dtype)
    engine = GenerateEngine(loaded, tokenizer) if batching is None else BatchingEngine(loaded, tokenizer, **batching)
    server = Server(loaded, tokenizer, name or model, engine, host, port, log_level)
    if block:
        server.run()
    else:
        server.start()
    return server
