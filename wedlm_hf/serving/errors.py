"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, which OpenAI clients read their
message from: transformers serve answers FastAPI's `{"detail": ...}` (the official client then shows only "Error
code: 400") and streams `data: {"error": "<message>"}` with the message unescaped (a quote breaks the JSON).

`add_error_handlers` has transformers' app write every error (HTTP errors, validation errors, dead continuous
batching, any other fault) in that shape; `openai_stream_errors` rewrites the streamed error event.
"""

import json
import logging
from collections.abc import AsyncIterator

from transformers.cli.serving.utils import CBWorkerDeadError

logger = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
               404: "not_found_error", 422: "invalid_request_error", 429: "rate_limit_error"}
STREAM_ERROR = 'data: {"error": "'
"""How transformers' handlers start a streamed error event (then the message, then `"}` and a blank line)."""
STREAM_ERROR_END = '"}\n\n'


def openai_error(message: str, status: int, param: str | None = None, code: str | None = None) -> dict:
    error_type = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


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

    async def engine_dead(_request, error: CBWorkerDeadError):
        return answer(503, str(error))

    async def server_error(request, call_next):
        """Any other fault is a 500 answered here: Starlette's handler for `Exception` re-raises after answering,
        and the server then drops the connection, which a client may be about to reuse."""
        try:
            return await call_next(request)
        except Exception as error:
            logger.exception("request failed")
            return answer(500, str(error) or type(error).__name__)

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(CBWorkerDeadError, engine_dead)
    app.middleware("http")(server_error)


async def openai_stream_errors(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """transformers' streamed events, its error event (always the last of its chunk) written as OpenAI's error
    object. Any other event is JSON, whose strings escape quotes, so the error event's opening cannot occur inside
    one."""
    try:
        async for chunk in events:
            start = chunk.find(STREAM_ERROR) if isinstance(chunk, str) else -1
            if start >= 0 and chunk.endswith(STREAM_ERROR_END):
                message = chunk[start + len(STREAM_ERROR) : -len(STREAM_ERROR_END)]
                chunk = chunk[:start] + f"data: {json.dumps(openai_error(message, 500))}\n\n"
            yield chunk
    finally:
        await events.aclose()
