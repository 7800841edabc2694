"""`transformers serve` (the OpenAI-compatible server of transformers) with WeDLM decoding.

The server loads a model by looking its architecture up by name in the `transformers` namespace, so it finds
neither `WeDLMForCausalLM` nor `auto_map`, and it never passes `decoding`. `ServeHooks` fixes both for one server's
lifetime and leaves the server itself untouched: the WeDLM classes are made visible under their names, and the
server builds a `ModelManager` subclass that enables each loaded model and makes WeDLM the default of its
generation config, which every request's config is copied from. It also builds subclasses of transformers'
endpoint handlers (handlers.py: every request field served or refused by name, the model named as the user named it), a
`GenerationState` subclass (managers.py: a request's seed and penalties handed to `generate`; with continuous
batching, WeDLM's own batching manager, batching.py, instead of transformers' paged-attention one), the streamer of
`generate()` streams (streamers.py: each text piece knows its tokens) and its app with OpenAI-shaped errors and an
optional API key (app.py). Each server's settings live in its own manager and state;
`WeDLMServe` installs the hooks when it starts and removes them when it stops.
"""

import errno
import functools
import socket
from collections.abc import Callable

from transformers import GenerationConfig, PreTrainedModel
from transformers.cli.serve import Serve
from transformers.cli.serving import model_manager
from transformers.cli.serving.utils import split_revision

import wedlm_hf
from wedlm_hf.generation.options import BY_KEYWORD, SERVE, exposed_to

GENERATION_OPTIONS = tuple(option.keyword for option in exposed_to(SERVE))
"""Generation config attributes that `serve` may set for every request."""
WEDLM_CLASSES = (wedlm_hf.WeDLMForCausalLM, wedlm_hf.WeDLMModel, wedlm_hf.WeDLMConfig)
_MISSING = object()


class WeDLMModelManager(model_manager.ModelManager):
    """Loads models as transformers serve does, then gives them `decoding="wedlm"` and this server's defaults."""

    def __init__(self, *args, generation_defaults: dict, served_names: dict | None = None, **kwargs):
        # before `super().__init__`, which may load the model
        self.generation_defaults = dict(generation_defaults)
        self.served_names = dict(served_names or {})
        """Model name a client sends (the one the user gave `serve`, e.g. `wedlm-tiny-code`) -> the folder loaded."""
        super().__init__(*args, **kwargs)

    def _folder(self, model_id_and_revision: str, gguf_file: str | None) -> tuple[str, str | None]:
        model_id, _ = split_revision(model_id_and_revision)
        name = model_id if gguf_file is None else f"{model_id}:{gguf_file}"
        return (self.served_names[name], None) if name in self.served_names else (model_id_and_revision, gguf_file)

    def _load_processor(self, model_id_and_revision: str, gguf_file: str | None = None):
        return super()._load_processor(*self._folder(model_id_and_revision, gguf_file))

    def _load_model(self, model_id_and_revision: str, *args, gguf_file: str | None = None, **kwargs) -> PreTrainedModel:
        folder, gguf_file = self._folder(model_id_and_revision, gguf_file)
        model = wedlm_hf.enable(super()._load_model(folder, *args, gguf_file=gguf_file, **kwargs))
        config: GenerationConfig = model.generation_config
        config.decoding = "wedlm"
        for name, value in self.generation_defaults.items():
            setattr(config, name, value)
        return model


class ServeHooks:
    """What `transformers serve` looks up by name, pointed at WeDLM's classes between `install()` and
    `uninstall()` (or inside `with`): the model classes in the `transformers` namespace, the endpoint handlers and
    app factory, and the `ModelManager` and `GenerationState` (with `batching`, `WeDLMCBGenerateManager` options)
    the server builds, bound to these settings; `served_names` maps the names clients send to the folders loaded,
    and `api_key`, given, is what every client must bring. `uninstall` restores exactly what `install` found."""

    def __init__(
        self,
        generation_defaults: dict,
        batching: dict | None = None,
        served_names: dict | None = None,
        api_key: str | None = None,
    ):
        unknown = set(generation_defaults) - set(GENERATION_OPTIONS)
        if unknown:
            raise ValueError(f"serve cannot set {sorted(unknown)}; settable: {', '.join(GENERATION_OPTIONS)}")
        for name, value in generation_defaults.items():
            BY_KEYWORD[name].checked(value)
        namespace = model_manager.transformers  # where the server looks architectures up by name
        self.replacements = [(namespace, cls.__name__, cls) for cls in WEDLM_CLASSES]
        manager = functools.partial(
            WeDLMModelManager, generation_defaults=generation_defaults, served_names=served_names or {}
        )
        self.replacements.append((model_manager, "ModelManager", manager))
        # where `Serve` looks them up when it starts (imported here: they need the serving dependencies)
        from transformers.cli.serving import chat_completion, completion, response, server
        from transformers.cli.serving import utils as serving_utils

        from . import app, handlers
        from .managers import WeDLMGenerationState
        from .streamers import LabellingDirectStreamer

        self.replacements += [
            (chat_completion, "ChatCompletionHandler", handlers.WeDLMChatCompletionHandler),
            (completion, "CompletionHandler", handlers.WeDLMCompletionHandler),
            (response, "ResponseHandler", handlers.WeDLMResponseHandler),
            (server, "build_server", functools.partial(app.build_server, api_key=api_key)),
            (serving_utils, "GenerationState", functools.partial(WeDLMGenerationState, batching=batching)),
            (serving_utils, "DirectStreamer", LabellingDirectStreamer),
        ]
        self.saved: list[tuple[object, str, object]] = []

    def install(self) -> None:
        if self.saved:
            raise RuntimeError("these serve hooks are already installed")
        for owner, name, value in self.replacements:
            self.saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
            setattr(owner, name, value)

    def uninstall(self) -> None:
        while self.saved:
            owner, name, value = self.saved.pop()
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)

    def __enter__(self) -> "ServeHooks":
        self.install()
        return self

    def __exit__(self, *exception) -> None:
        self.uninstall()


class WeDLMServe(Serve):
    """transformers' `Serve` with `ServeHooks` installed for its lifetime: until it returns (blocking), or until
    `kill_server()` (`non_blocking=True`)."""

    def __init__(self, hooks: ServeHooks, **server_options):
        self.hooks = hooks
        hooks.install()
        try:
            super().__init__(**server_options)
        except BaseException:
            hooks.uninstall()
            raise
        if not server_options.get("non_blocking"):
            hooks.uninstall()

    def kill_server(self) -> None:
        try:
            super().kill_server()
        finally:
            self.hooks.uninstall()


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


def serve(
    model: str,
    *,
    host: str,
    port: int,
    generation_defaults: dict,
    batching: dict | None = None,
    name: str | None = None,
    announce: Callable[[], None] | None = None,
    api_key: str | None = None,
    **server_options,
) -> WeDLMServe:
    """Run `transformers serve` pinned to `model`: until interrupted, or in a thread with `non_blocking=True`
    (then stop it with the returned server's `kill_server()`); with `batching` (max_batch_size, max_batch_tokens),
    requests are continuously batched by WeDLM's scheduler. `name` (default: `model`) is the model id clients
    send, `/v1/models` lists and responses name. With `api_key`, a request without `Authorization: Bearer
    <api_key>` is answered 401 (auth.py). An OSError says so at once if the port cannot be listened on;
    `announce` is called once it can, before the model loads."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        raise ImportError("`wedlm-hf serve` needs transformers' serving dependencies: pip install 'wedlm-hf[serve]'")
    if api_key is not None and not api_key.strip():
        raise ValueError("the API key is empty: give a non-empty key, or none")
    check_port(host, port)
    if announce is not None:
        announce()
    name = name or model
    hooks = ServeHooks(
        generation_defaults, batching, served_names={name: model} if name != model else None, api_key=api_key
    )
    return WeDLMServe(
        hooks, force_model=name, host=host, port=port, continuous_batching=batching is not None, **server_options
    )
