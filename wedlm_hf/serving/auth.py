"""An API key for a server others can reach. transformers serve checks none, so one middleware on its app asks
every request (but the health check and, where the app enables CORS, browsers' preflights, which carry no key) for
`Authorization: Bearer <key>`, what OpenAI clients send from their `api_key`, and answers any other with HTTP 401
in OpenAI's error shape."""

import hmac
import ipaddress

from .errors import openai_error

API_KEY_VARIABLE = "WEDLM_API_KEY"
"""The environment variable `wedlm-hf serve` reads the key from (a command line is visible to every local user)."""
OPEN_PATHS = ("/health",)


def require_api_key(app, api_key: str) -> None:
    """Answer 401 to every request to `app` that does not bring `api_key`."""
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import JSONResponse

    expected = f"Bearer {api_key}".encode()
    cors = any(middleware.cls is CORSMiddleware for middleware in app.user_middleware)  # it answers preflights

    async def check_key(request, call_next):
        preflight = cors and request.method == "OPTIONS" and "access-control-request-method" in request.headers
        given = request.headers.get("authorization", "").encode()
        if request.url.path in OPEN_PATHS or preflight or hmac.compare_digest(given, expected):
            return await call_next(request)
        message = (
            "Incorrect API key provided." if given
            else "No API key provided: send it as `Authorization: Bearer <key>` (an OpenAI client's api_key)."
        )
        return JSONResponse(
            openai_error(message, 401, code="invalid_api_key"), status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )

    app.middleware("http")(check_key)


def is_loopback(host: str) -> bool:
    """Whether a server bound to `host` is reachable from this machine alone."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to any interface
        return False
