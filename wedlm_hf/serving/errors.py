"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, which OpenAI clients read their
message from (FastAPI's own `{"detail": ...}` shows in the official client as a bare "Error code: 400"), for every
status: HTTP errors, validation errors, a stopped engine and any other fault; a streamed error is an event of the
same shape.
"""

import json
import logging

logger = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 422: "invalid_request_error", 429: "rate_limit_error"}
SERVER_ERROR, ENGINE_STOPPED = 500, 503


class EngineStopped(RuntimeError):
    """The continuous batching engine has stopped: this request, and every later one, gets a 503."""


def openai_error(message: str, status: int, param: str | None = None) -> dict:
    error_type = ERROR_TYPES.get(status, "server_error" if status >= SERVER_ERROR else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": None}}


def error_event(error: BaseException) -> str:
    """A fault met while streaming, as the stream's last event."""
    status = ENGINE_STOPPED if isinstance(error, EngineStopped) else SERVER_ERROR
    return f"data: {json.dumps(openai_error(str(error) or type(error).__name__, status))}\n\n"


def invalid_request(message: str, param: str | None = None, status: int = 400):
    """The HTTP error for a request field at fault (`param`: its name as the client sent it)."""
    from fastapi import HTTPException

    error = HTTPException(status_code=status, detail=message)
    error.param = param
    return error


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """FastAPI's validation errors as one line, and the body field at fault when there is one."""
    parts, param = [], None
    for error in errors:
        fields = [part for part in error.get("loc", ()) if isinstance(part, str) and part != "body"]
        detail = (error.get("ctx") or {}).get("error")  # e.g. what the JSON parser expected
        message = str(error.get("msg")) + (f": {detail}" if detail else "")
        parts.append(f"{'.'.join(fields)}: {message}" if fields else message)
        param = param or (fields[0] if fields else None)
    return "; ".join(parts) or "invalid request", param


def add_error_handlers(app) -> None:
    """Answer every error `app` raises in OpenAI's shape."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    def answer(status: int, message: str, param: str | None = None, headers=None) -> JSONResponse:
        return JSONResponse(openai_error(message, status, param), status_code=status, headers=headers)

    async def http_error(_request, error: HTTPException):
        return answer(error.status_code, str(error.detail), getattr(error, "param", None), error.headers)

    async def validation_error(_request, error: RequestValidationError):
        return answer(422, *_validation_message(error.errors()))

    async def engine_stopped(_request, error: EngineStopped):
        return answer(ENGINE_STOPPED, str(error))

    async def server_error(request, call_next):
        """Any other fault is a 500 answered here: Starlette's handler for `Exception` re-raises after answering,
        and the server then drops the connection, which a client may be about to reuse."""
        try:
            return await call_next(request)
        except Exception as error:
            logger.exception("request failed")
            return answer(SERVER_ERROR, str(error) or type(error).__name__)

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(EngineStopped, engine_stopped)
    app.middleware("http")(server_error)
