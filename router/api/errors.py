"""Client-facing errors in the OpenAI/vLLM shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from http import HTTPStatus


class RequestError(Exception):
    """A request the router refuses before (or instead of) generating: bad input, unknown model, overload."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}

    def __reduce__(self):
        # NOTE: an exception pickles as its class and args alone; parsing in a worker process (router/api/offload.py)
        # sends it back with every field.
        return RequestError, (self.status, self.message, self.param, self.headers)


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, param)


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": status}}


def error_type(status: int) -> str:
    """vLLM's names: BadRequestError, NotFoundError, TooManyRequestsError, ServiceUnavailableError, ..."""
    try:
        words = HTTPStatus(status).phrase.split()
    except ValueError:
        return "Error"
    name = "".join(word.capitalize() for word in words)
    return name if name.endswith("Error") else name + "Error"
