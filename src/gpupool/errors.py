"""What can go wrong, for the API to map to HTTP codes and the CLI to exit codes.

GpupoolError
├── InvalidInput    the request or file is wrong: says what and where (HTTP 400/422)
├── Unauthorized    no token, or one nobody has (HTTP 401)
├── Forbidden       the token may not do this (HTTP 403)
├── NotFound        no such job, team, class or node (HTTP 404)
├── Conflict        the request is valid but the state forbids it now (HTTP 409)
└── StoreUnavailable the store cannot be reached, or the scheduler stopped deciding (HTTP 503)
"""

from __future__ import annotations


class GpupoolError(Exception):
    """Base of every error gpupool reports to a person."""


class InvalidInput(GpupoolError):
    pass


class NotFound(GpupoolError):
    pass


class Unauthorized(GpupoolError):
    pass


class Forbidden(GpupoolError):
    pass


class Conflict(GpupoolError):
    pass


class StoreUnavailable(GpupoolError, OSError):
    """The store cannot be opened (a server that refuses or is not there, a login refused, a
    SQLite file in a missing folder): one line with its URL, password masked, and the reason."""


HTTP_STATUS: dict[type[GpupoolError], int] = {
    InvalidInput: 400,
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    StoreUnavailable: 503,
}
"""The one table between errors and HTTP: the API answers with it, the client reads it back."""
