"""cancel.py in-process: what a client's leaving does to the work of its request (its hooks, checks and waits).

Server-level: a client that leaves a stream cuts the LLM and models-server calls in flight (test_hostile_round3.py,
test_stream.py); here each piece those rely on, as a request's threads use it."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from hugginggpt import cancel
from hugginggpt.cancel import CURRENT, Cancelled, CancelToken
from hugginggpt.errors import HuggingGPTError


def under(token: CancelToken | None):
    """Run the rest of a test as a thread of the request that `token` cancels."""
    return CURRENT.set(token)


def test_a_cancelled_request_is_a_499_cancelled_error_the_routes_know():
    exc = Cancelled("x")
    assert isinstance(exc, HuggingGPTError)  # answered as an error of the request, not a 500 "internal error"
    assert (exc.status, exc.kind) == (499, "cancelled")


def test_check_names_what_was_cancelled_and_passes_while_nothing_is():
    token = CancelToken()
    reset = under(token)
    try:
        cancel.check()  # not cancelled: nothing happens
        assert not cancel.cancelled()
        token.cancel()
        assert cancel.cancelled() and token.cancelled
        with pytest.raises(Cancelled, match=r"^the request was cancelled \(the client went away\)$"):
            cancel.check()
        with pytest.raises(Cancelled, match=r"^the LLM call was cancelled"):
            cancel.check("the LLM call")
    finally:
        CURRENT.reset(reset)
    assert not cancel.cancelled()  # another thread of no request: never cancelled
    cancel.check()


def test_every_hook_runs_once_even_when_one_fails_and_the_failure_is_logged(caplog):
    token = CancelToken()
    ran: list[str] = []

    def broken() -> None:
        ran.append("broken")
        raise ValueError("a socket that was already closed")

    with token.hooked(broken), token.hooked(lambda: ran.append("llm")), token.hooked(lambda: ran.append("model")):
        with caplog.at_level(logging.ERROR, logger="hugginggpt.cancel"):
            token.cancel()  # does not raise to the one who cancels (the disconnect watcher, a stream)
            token.cancel()  # a second cancel runs nothing again
    assert sorted(ran) == ["broken", "llm", "model"]
    assert [r.getMessage() for r in caplog.records] == ["a cancel hook failed"]


def test_io_hooked_after_the_cancel_is_stopped_at_once_and_a_finished_block_is_no_longer_hooked():
    token = CancelToken()
    ran: list[str] = []
    with token.hooked(lambda: ran.append("finished")):
        pass
    with pytest.raises(RuntimeError), token.hooked(lambda: ran.append("failed")):
        raise RuntimeError("the call failed")
    token.cancel()
    assert ran == []  # neither block was running any more
    with token.hooked(lambda: ran.append("late")):
        assert ran == ["late"]  # started after the client left: shut at once, before it connects


def test_a_call_that_ends_inside_a_longer_one_leaves_the_longer_one_hooked():
    """A task's model call (its socket hooked) ends while the LLM stream of the same request still runs: the
    client leaving afterwards must still cut the stream."""
    token = CancelToken()
    ran: list[str] = []
    with token.hooked(lambda: ran.append("llm stream")):
        with token.hooked(lambda: ran.append("model call")):
            pass
        with pytest.raises(RuntimeError), token.hooked(lambda: ran.append("failed call")):
            raise RuntimeError("the call failed")
        token.cancel()
        assert ran == ["llm stream"]


def test_a_wait_under_a_request_ends_when_its_client_leaves_and_raises():
    token = CancelToken()
    reset = under(token)
    try:
        threading.Timer(0.2, token.cancel).start()
        started = time.monotonic()
        with pytest.raises(Cancelled):
            cancel.sleep(30)  # a retry's back-off
        assert time.monotonic() - started < 5
    finally:
        CURRENT.reset(reset)


def test_a_wait_lasts_its_seconds_with_or_without_a_request():
    token = CancelToken()
    started = time.monotonic()
    assert token.sleep(0.3) is False
    assert time.monotonic() - started >= 0.29  # seconds, not milliseconds
    reset = under(token)
    try:
        started = time.monotonic()
        cancel.sleep(0.3)
        assert time.monotonic() - started >= 0.29
    finally:
        CURRENT.reset(reset)
    started = time.monotonic()
    cancel.sleep(0.3)  # a thread of no request (the CLI's, a background sync): a plain sleep
    assert time.monotonic() - started >= 0.29
    token.cancel()
    started = time.monotonic()
    assert token.sleep(30) is True and time.monotonic() - started < 1


def test_a_hook_sees_its_request_cancelled_so_io_it_starts_is_stopped_too():
    token = CancelToken()
    seen: list[object] = []

    def retry_at_once() -> None:  # a client library that reconnects when its socket is shut
        seen.append(token.cancelled)
        with token.hooked(lambda: seen.append("second socket shut")):
            pass

    with token.hooked(retry_at_once):
        token.cancel()
    assert seen == [True, "second socket shut"]
