"""`wedlm-hf serve`: an OpenAI-compatible server decoding with WeDLM, on FastAPI and uvicorn.

server.py: `serve`, `Server`, loading the model. handlers.py: the endpoints. requests.py: a request's fields with
OpenAI's meaning. managers.py, batching.py: the engines that decode (one `generate` at a time, or WeDLM's
continuous batching). errors.py: errors in OpenAI's shape.
"""

from .server import GENERATION_OPTIONS, Server, check_generation_defaults, check_port, serve

__all__ = ["GENERATION_OPTIONS", "Server", "check_generation_defaults", "check_port", "serve"]
