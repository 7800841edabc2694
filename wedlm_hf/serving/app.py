"""The server's FastAPI app: transformers serve's own (`server.build_server`), answering its errors in OpenAI's
shape (errors.py) and, given an API key, to clients that bring it alone (auth.py)."""

from transformers.cli.serving import server

from .auth import require_api_key
from .errors import add_error_handlers

TRANSFORMERS_BUILD_SERVER = server.build_server


def build_server(*args, api_key: str | None = None, **kwargs):
    app = TRANSFORMERS_BUILD_SERVER(*args, **kwargs)
    add_error_handlers(app)
    if api_key is not None:
        require_api_key(app, api_key)
    return app
