"""`wedlm-hf serve`: transformers serve (its OpenAI-compatible server) with WeDLM decoding, through hooks that
swap what the server looks up by name for one server's lifetime (hooks.py); nothing of the server is rewritten.

hooks.py: `serve`, `ServeHooks`, the model manager. handlers.py: the endpoint handlers; fields.py: what each
request field gets (served or refused by name); requests.py: the sampling fields with OpenAI's meaning; prompts.py:
the prompt's forms and size bound; choices.py, responses.py: `n` choices joined into one response; logprobs.py,
streamers.py: log-probabilities, streamed text that knows its tokens. managers.py, batching.py: which generate
manager serves a request (WeDLM's continuous batching in batching.py). app.py, errors.py, auth.py: the app, its
errors in OpenAI's shape, its API key.
"""

from ..generation.transformers_version import SERVING_RELEASES, require_transformers

# before hooks.py imports transformers serve's classes, which other releases shape differently or lack
require_transformers(SERVING_RELEASES, "WeDLM serving (built on transformers serve's classes)", extra="[serving]")

from .hooks import GENERATION_OPTIONS, ServeHooks, WeDLMModelManager, WeDLMServe, check_port, serve

__all__ = ["GENERATION_OPTIONS", "ServeHooks", "WeDLMModelManager", "WeDLMServe", "check_port", "serve"]
