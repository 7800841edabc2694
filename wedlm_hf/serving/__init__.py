"""`wedlm-hf serve`: transformers serve (its OpenAI-compatible server) with WeDLM decoding, through hooks that
swap what the server looks up by name for one server's lifetime (hooks.py); nothing of the server is rewritten.

hooks.py: `serve`, `ServeHooks`, the model manager. handlers.py, requests.py: the endpoint handlers, a request's
fields with OpenAI's meaning. managers.py, batching.py: which generate manager serves a request (WeDLM's continuous
batching in batching.py). errors.py: errors in OpenAI's shape.
"""

from ..generation.transformers_version import SERVING_RELEASES, require_transformers

# before hooks.py imports transformers serve's classes, which other releases shape differently or lack
require_transformers(SERVING_RELEASES, "WeDLM serving (built on transformers serve's classes)", extra="[serving]")

from .hooks import GENERATION_OPTIONS, ServeHooks, WeDLMModelManager, WeDLMServe, check_port, serve

__all__ = ["GENERATION_OPTIONS", "ServeHooks", "WeDLMModelManager", "WeDLMServe", "check_port", "serve"]
