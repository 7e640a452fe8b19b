"""Edge cases of hugginggpt/requestctx.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import contextvars
import io
import logging
import re
import threading

import pytest

from hugginggpt.requestctx import (
    HEADER,
    REQUEST_ID,
    ContextThreadPool,
    RequestIdFilter,
    new_request_id,
    request_id_from_header,
)


def test_header_name_is_the_conventional_one():
    # Clients and proxies send and read exactly this header; its spelling is what they see in responses.
    assert HEADER == "X-Request-ID"


def test_new_ids_are_twelve_hex_digits_and_distinct():
    ids = {new_request_id() for _ in range(50)}
    assert len(ids) == 50
    for rid in ids:
        assert re.fullmatch(r"[0-9a-f]{12}", rid), rid


@pytest.mark.parametrize("value", [
    "a", "Z", "7", "abc-123", "req.1", "trace:span", "a_b", "A" * 64, "x" + "._:-" * 15 + "yz9",
])
def test_client_id_that_is_a_plain_token_is_kept(value):
    assert request_id_from_header(value) == value


@pytest.mark.parametrize("value", [
    None, "", "A" * 65, "-abc", ".abc", "_abc", ":abc", "a b", "a/b", "a\nb", "abc\n", "é", "a;b", "<script>",
])
def test_client_id_that_is_not_a_plain_token_is_replaced_by_a_new_one(value):
    rid = request_id_from_header(value)
    assert rid != value
    assert re.fullmatch(r"[0-9a-f]{12}", rid), rid


def test_pool_calls_see_the_submitters_request_id_and_get_their_arguments():
    def work(a, b, *, c):
        return (REQUEST_ID.get(), threading.current_thread().name, a, b, c)

    with ContextThreadPool(max_workers=2, thread_name_prefix="task") as pool:
        token = REQUEST_ID.set("req-42")
        try:
            rid, name, a, b, c = pool.submit(work, 1, "two", c=[3]).result(timeout=5)
        finally:
            REQUEST_ID.reset(token)
        assert (rid, a, b, c) == ("req-42", 1, "two", [3])
        assert name.startswith("task")
        assert name != threading.current_thread().name
        # a later submit from outside any request sees none, although the worker thread is reused
        assert pool.submit(work, 0, 0, c=0).result(timeout=5)[0] is None


def test_pool_call_changes_stay_in_its_own_copy_of_the_context():
    def work():
        REQUEST_ID.set("inside")
        return REQUEST_ID.get()

    token = REQUEST_ID.set("outer")
    try:
        with ContextThreadPool(max_workers=1) as pool:
            assert pool.submit(work).result(timeout=5) == "inside"
        assert REQUEST_ID.get() == "outer"
    finally:
        REQUEST_ID.reset(token)


def _log_line(message: str) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("[%(request_id)s] %(message)s"))
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("test_requestctx.filter")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        logger.info(message)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_log_line_outside_a_request_shows_a_dash():
    assert contextvars.copy_context().run(_log_line, "hello") == "[-] hello\n"


def test_log_line_inside_a_request_names_it():
    def inside():
        REQUEST_ID.set("abc123")
        return _log_line("working")

    assert contextvars.Context().run(inside) == "[abc123] working\n"


def test_log_line_with_an_empty_request_id_shows_a_dash():
    def inside():
        REQUEST_ID.set("")
        return _log_line("x")

    assert contextvars.Context().run(inside) == "[-] x\n"
