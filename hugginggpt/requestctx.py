"""The request a thread is working for: its id in every log line, carried into the shared thread pools.

A request's work runs on many threads (the HTTP thread, selection threads, task threads, status checks).
`REQUEST_ID` is a context variable set by the pipeline; `ContextThreadPool` runs each submitted call in a copy
of the submitter's context, so a log line written by a task thread still names the request that started it.
The id a client sends in `X-Request-ID` is used when it is a plain token (it ends up in logs and headers).
"""

from __future__ import annotations

import contextvars
import logging
import re
import uuid
from concurrent.futures import Future, ThreadPoolExecutor

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
HEADER = "X-Request-ID"
_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def new_request_id() -> str:
    return uuid.uuid4().hex[:12]


def request_id_from_header(value: str | None) -> str:
    """The client's id when it is 1-64 characters of letters, digits and `._:-`; else a new one (an id is
    written to logs and echoed in a header, so nothing else is taken from a client)."""
    if value and _VALID.fullmatch(value):
        return value
    return new_request_id()


class ContextThreadPool(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose calls see the context (request id) of the thread that submitted them."""

    def submit(self, fn, /, *args, **kwargs) -> Future:  # type: ignore[override]
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` ("-" outside a request) to every record, for the `%(request_id)s` of the format."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get() or "-"
        return True
