"""Who a request speaks for: its bearer token, checked against the admin's, a team's or a
user's (in the store), or, on the job protocol's routes, the token of the attempt the path
names; then the rule of its route (`access.ROUTES`) is applied. Routes take the principal as
a parameter `who: Who`."""

# No `from __future__ import annotations`: FastAPI reads the dependencies from the signatures.
import hmac
from typing import Annotated, Literal

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import Field, TypeAdapter, ValidationError

from gpupool.api import access, limits
from gpupool.api.access import JOB_RULES, Principal, Rule
from gpupool.api.context import Context, Ctx
from gpupool.errors import Unauthorized
from gpupool.service.workspace import token_hash
from gpupool.store.schema import JobRow

bearer = HTTPBearer(auto_error=False, description="The admin's, a team's, a user's or an attempt's token.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def identify(ctx: Context, token: str | None) -> Principal:
    """The admin, or the team or user whose token this is; `Unauthorized` for any other."""
    if not token:
        raise Unauthorized("send the token as 'Authorization: Bearer TOKEN'")
    digest = token_hash(token)
    if hmac.compare_digest(digest, ctx.admin_hash):
        return Principal(admin=True, team=None)
    holder = ctx.store.holder_of(digest)
    if holder is None:
        raise Unauthorized("this token is not the admin's, a team's nor a user's")
    return Principal(admin=False, team=holder[0], user=holder[1])


def authorize(request: Request, ctx: Ctx, credentials: Credentials) -> Principal:
    """The principal of the request, once the rule of its route (`access.ROUTES`) allows it."""
    rule = access.rule_of(request.method, request.scope["route"].path)
    token = credentials.credentials if credentials is not None else None
    if rule is Rule.ATTEMPT:
        job_id, attempt = number(request, "path", "job_id"), number(request, "path", "attempt")
        if not token:
            raise Unauthorized("send the attempt's token (GPUPOOL_TOKEN) as 'Authorization: Bearer TOKEN'")
        ctx.store.check_attempt_token(job_id, attempt, token_hash(token))
        return Principal(admin=False, team=None, attempt=(job_id, attempt))
    who = identify(ctx, token)
    job: JobRow | None = None
    if rule in JOB_RULES:
        job = ctx.store.job(number(request, "path", "job_id"))
    elif rule is Rule.EVENTS and request.query_params.get("job") is not None:
        job = ctx.store.job(number(request, "query", "job"))
    access.enforce(who, rule, job)
    return who


Who = Annotated[Principal, Depends(authorize)]

Id = Annotated[int, Field(ge=0, le=limits.INT32)]
NUMBER = TypeAdapter(Id)


def number(request: Request, where: Literal["path", "query"], name: str) -> int:
    """A path or query parameter as the route itself reads it: an id, or a 422 saying why not."""
    raw = (request.path_params if where == "path" else request.query_params).get(name, "")
    try:
        return NUMBER.validate_strings(str(raw))
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": (where, name)} for e in exc.errors()]) from None
