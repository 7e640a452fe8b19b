"""httpbody.py in-process: the gate's judgement and the listeners' sweep (the servers: test_body_limits.py)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from hugginggpt.httpbody import BodyGate, Refusal, guard_bodies, headers_of


class Listener:
    """What guard_bodies uses of a waitress listener: its channel class, its maintenance and its channels."""

    class Channel:
        parser_class = object

    def __init__(self) -> None:
        self.channel_class = self.Channel
        self.swept: list[float] = []
        self.active_channels: dict[int, SimpleNamespace] = {}

    def maintenance(self, now: float) -> None:
        self.swept.append(now)


def test_each_listener_sweeps_its_own_connections_after_their_linger():
    ipv4, ipv6 = Listener(), Listener()  # `localhost` listens on both
    guard_bodies([ipv4, ipv6], BodyGate(10))
    assert ipv4.channel_class is ipv6.channel_class  # one guarded class per waitress class
    assert ipv4.channel_class.__name__ == "GuardedChannel"
    now = time.monotonic()
    over = SimpleNamespace(linger_until=now - 0.1, will_close=False)  # its linger ended
    lingering = SimpleNamespace(linger_until=now + 60, will_close=False)
    plain = SimpleNamespace(will_close=False)  # never refused
    ipv4.active_channels = {1: over, 2: plain}
    ipv6.active_channels = {3: lingering}
    ipv4.maintenance(5.0)
    assert ipv4.swept == [5.0] and ipv6.swept == []  # waitress's own maintenance, of this listener
    assert over.will_close and not plain.will_close and not lingering.will_close
    late = SimpleNamespace(linger_until=now - 0.1, will_close=False)
    ipv6.active_channels[4] = late
    ipv6.maintenance(6.0)
    assert ipv6.swept == [6.0] and late.will_close and not lingering.will_close


def test_the_gate_judges_the_token_before_the_length_and_reads_headers_as_the_app_does():
    seen = []

    def check(method, path, headers):
        seen.append((method, path, headers.get("Authorization"), headers.get("Content-Type")))
        return None if headers.get("Authorization") == "Bearer t" else Refusal(401, "no token")

    gate = BodyGate(100, check)
    raw = headers_of({"AUTHORIZATION": "Bearer x", "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": "999"})
    assert gate.judge("POST", "/tasks", raw, 999) == Refusal(401, "no token")  # no hint of the limit first
    assert seen == [("POST", "/tasks", "Bearer x", "application/json")]
    good = headers_of({"AUTHORIZATION": "Bearer t"})
    assert gate.judge("POST", "/tasks", good, 100) is None  # at the limit: allowed
    assert gate.judge("POST", "/tasks", good, 101) == Refusal(413, "request body is larger than 100 bytes")
    assert gate.judge("POST", "/tasks", good, None) is None  # chunked: judged as it comes
    assert BodyGate(5, too_large_kind=None).too_large() == Refusal(413, "request body is larger than 5 bytes", None)


def test_a_refusal_is_the_app_s_json_error_with_its_status_line_and_headers():
    from http import HTTPStatus

    from hugginggpt.httpbody import JsonError, plain_error

    typed = Refusal(413, "request body is larger than 5 bytes")
    assert plain_error("/tasks", typed) == {"error": {"message": "request body is larger than 5 bytes",
                                                      "type": "invalid_request_error"}}
    untyped = Refusal(401, "this models server needs a token", None)
    assert plain_error("/models/x", untyped) == {"error": {"message": "this models server needs a token"}}
    err = JsonError(typed, plain_error("/tasks", typed))
    assert err.body == "request body is larger than 5 bytes"  # waitress's own record of the error
    status, headers, body = err.to_response()
    assert status == f"413 {HTTPStatus(413).phrase}"
    assert dict(headers) == {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}
    assert json.loads(body) == {"error": {"message": "request body is larger than 5 bytes",
                                          "type": "invalid_request_error"}}


def test_a_gate_without_a_check_judges_the_length_alone():
    gate = BodyGate(100)
    headers = headers_of({"CONTENT_LENGTH": "101", "CONTENT_TYPE": "text/plain"})
    assert headers.get("Content-Length") == "101" and headers.get("Content-Type") == "text/plain"
    assert gate.judge("POST", "/upload", headers, 100) is None
    assert gate.judge("POST", "/upload", headers, 101).status == 413


# -- the guarded parser, fed bytes as waitress feeds it ------------------------------------------------------------


class Channel:
    """What the guarded parser tells its channel: that a request of this connection was refused."""

    refused = False


def guarded_parser(gate: BodyGate, **adjust):
    from waitress.adjustments import Adjustments
    from waitress.channel import HTTPChannel

    from hugginggpt.httpbody import guarded_channel_class

    cls = guarded_channel_class(HTTPChannel, gate)
    channel = Channel()
    return cls.parser_class(channel, Adjustments(**adjust)), channel  # GuardedChannel.parser_class(self, adj)


def token_check(method, path, headers):
    if headers.get("Authorization") != "Bearer t":
        return Refusal(401, f"{method} {path} needs the token", None)
    return None


def request(method: str = "POST", headers: dict | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} /models/x HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_a_refusal_takes_the_whole_packet_and_answers_in_the_app_s_json():
    parser, channel = guarded_parser(BodyGate(1000, token_check))
    hidden = b"GET /running HTTP/1.1\r\nHost: x\r\n\r\n"
    data = request(headers={"Content-Length": str(len(hidden)), "Expect": "100-continue"}, body=hidden)
    assert parser.received(data) == len(data)  # the body that came along is taken, never parsed as a request
    assert parser.completed and channel.refused
    assert parser.body_rcv is None and parser.expect_continue is False  # no "100 Continue" for an unread body
    status, headers, body = parser.error.to_response()
    assert status.startswith("401 ") and json.loads(body) == {"error": {"message": "POST /models/x needs the token"}}
    assert parser.received(b"more") == 0  # completed: nothing more is taken


def test_a_request_without_a_body_is_left_to_the_app_and_one_with_a_byte_is_judged():
    parser, channel = guarded_parser(BodyGate(1000, token_check))
    data = request("GET")
    assert parser.received(data) == len(data)
    assert parser.error is None and not channel.refused  # the app answers it (and keeps the connection)
    parser, channel = guarded_parser(BodyGate(1000, token_check))
    parser.received(request(headers={"Content-Length": "1"}, body=b"x"))
    assert channel.refused and parser.error.code == 401
    allowed, channel = guarded_parser(BodyGate(1000, token_check))
    data = request(headers={"Content-Length": "2", "Authorization": "Bearer t"}, body=b"ok")
    taken = allowed.received(data)  # the headers, then (as waitress calls it again) the body
    assert allowed.received(data[taken:]) == 2
    assert allowed.completed and allowed.error is None and not channel.refused


def test_a_chunked_body_is_refused_once_what_came_passes_the_limit_not_at_it():
    def chunk(n: int) -> bytes:
        return b"%x\r\n" % n + b"x" * n + b"\r\n"

    head = request(headers={"Transfer-Encoding": "chunked", "Authorization": "Bearer t"})
    exact, channel = guarded_parser(BodyGate(100, token_check))
    exact.received(head)
    assert exact.error is None  # a chunked body's length is judged as it comes
    exact.received(chunk(60))
    exact.received(chunk(40))
    assert exact.error is None and not channel.refused  # 100 of 100
    exact.received(b"0\r\n\r\n")
    assert exact.completed and exact.error is None
    over, channel = guarded_parser(BodyGate(100, token_check))
    over.received(head)
    over.received(chunk(60))
    over.received(chunk(41))
    assert channel.refused and over.error.code == 413
    assert json.loads(over.error.to_response()[2]) == {"error": {"message": "request body is larger than 100 bytes",
                                                               "type": "invalid_request_error"}}


def test_waitress_s_own_body_limit_is_answered_in_the_app_s_json_too():
    parser, channel = guarded_parser(BodyGate(1000, too_large_kind="too_large"), max_request_body_size=50)
    parser.received(request(headers={"Content-Length": "60"}))
    assert channel.refused
    status, _, body = parser.error.to_response()
    assert status.startswith("413 ")
    assert json.loads(body) == {"error": {"message": "request body is larger than 50 bytes", "type": "too_large"}}


def test_an_app_s_gate_is_found_only_where_it_registered_one():
    from hugginggpt.httpbody import BODY_GATE, gate_of

    gate = BodyGate(10)
    assert gate_of(SimpleNamespace(extensions={BODY_GATE: gate})) is gate
    assert gate_of(SimpleNamespace(extensions={BODY_GATE: "not a gate"})) is None
    assert gate_of(SimpleNamespace(extensions={})) is None
    assert gate_of(object()) is None  # an app that is not Flask's: served without a gate


def test_a_refusal_is_logged_with_the_request_line_and_the_answer(caplog):
    import logging

    parser, _ = guarded_parser(BodyGate(1000, token_check))
    with caplog.at_level(logging.INFO, logger="hugginggpt.httpbody"):
        parser.received(request(headers={"Content-Length": "5"}, body=b"hello"))
    assert [r.getMessage() for r in caplog.records] == [
        "refused POST /models/x before reading its body: 401 POST /models/x needs the token"]


def test_each_refusal_is_told_to_the_app_s_metrics_and_a_long_path_is_logged_cut(caplog):
    import logging

    seen: list[tuple] = []
    parser, _ = guarded_parser(BodyGate(1000, token_check, observe=lambda *args: seen.append(args)))
    long_path = "/models/" + "x" * 300
    data = f"POST {long_path} HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello".encode()
    with caplog.at_level(logging.INFO, logger="hugginggpt.httpbody"):
        parser.received(data)
    assert [(method, path, refusal.status) for method, path, refusal in seen] == [("POST", long_path, 401)]
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"refused POST {long_path[:100]} before reading its body: 401 ")
