"""Issue 29: the MCP stdio server (`python -m hugginggpt.mcp`, a real subprocess) answers every line it cannot
take with a JSON-RPC error (the request's id when the line still tells it), and goes on: after each bad line
a good `tools/list` is answered. Before, the SDK's transport dropped such lines and the client waited forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hugginggpt.mcp.lines import INVALID_REQUEST, PARSE_ERROR, check_line, claimed_stdin, top_level_id
from tests.conftest import ROOT, write_config

MAX_BODY = 500_000
WAIT = 5.0
DEEP = 100_000


class StdioClient:
    """The server as a subprocess, spoken to in raw lines."""

    def __init__(self, config: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "hugginggpt.mcp", "--config", config], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 1000

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.messages.put(json.loads(line))

    def send(self, line: str | bytes) -> None:
        data = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict | None = None, ident: int | None = None) -> str:
        if ident is None:
            self.next_id += 1
            ident = self.next_id
        return json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, **({"params": params} if params else {})})

    def wait(self, match: Any, timeout: float = WAIT) -> dict[str, Any]:
        """The first message (seen or arriving within `timeout`) for which match(message) holds."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.seen:
                if match(message):
                    self.seen.remove(message)
                    return message
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"no such answer within {timeout}s (server exit code {self.proc.poll()}); "
                                     f"got {self.seen}")
            try:
                self.seen.append(self.messages.get(timeout=min(left, 0.2)))
            except queue.Empty:
                pass

    def error_for(self, ident: Any) -> dict[str, Any]:
        return self.wait(lambda m: "error" in m and m.get("id") == ident)["error"]

    def still_answers(self) -> None:
        line = self.request("tools/list")
        ident = json.loads(line)["id"]
        self.send(line)
        answer = self.wait(lambda m: m.get("id") == ident)
        assert "run_model" in {t["name"] for t in answer["result"]["tools"]}, answer


@pytest.fixture(scope="module")
def client(tmp_path_factory, llm_server, models_server, public_dir) -> Iterator[StdioClient]:
    folder = tmp_path_factory.mktemp("stdio")
    _, models_url = models_server
    config = write_config(folder, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                          max_body_bytes=MAX_BODY)
    client = StdioClient(str(config))
    client.send(client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                              "clientInfo": {"name": "hostile", "version": "1"}}, ident=0))
    assert "result" in client.wait(lambda m: m.get("id") == 0, timeout=60)
    client.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    client.still_answers()
    yield client
    client.proc.stdin.close()
    try:
        client.proc.wait(10)
    except subprocess.TimeoutExpired:
        client.proc.kill()


def search(ident: int, q: str) -> str:
    """A search_models call whose `q` is the raw JSON text `q`."""
    return (f'{{"jsonrpc":"2.0","id":{ident},"method":"tools/call","params":{{"name":"search_models",'
            f'"arguments":{{"q":{q}}}}}}}')


def test_deep_nesting_is_answered_with_the_requests_id(client):
    client.send(search(11, "[" * DEEP + "]" * DEEP))
    error = client.error_for(11)
    assert error["code"] == INVALID_REQUEST and "nested too deeply" in error["message"]
    client.still_answers()
    client.send("[" * DEEP + "]" * DEEP)  # no id to tell
    assert client.error_for(None)["code"] == INVALID_REQUEST
    client.send(search(12, "[" * 250 + "]" * 250))  # deeper than the SDK reads, not than Python does
    assert "nested too deeply" in client.error_for(12)["message"]
    client.still_answers()


def test_a_lone_surrogate_is_answered_with_the_requests_id(client):
    client.send(search(21, '"\\ud800 alone"'))
    error = client.error_for(21)
    assert error["code"] == INVALID_REQUEST and "lone UTF-16 surrogate (\\ud800)" in error["message"]
    client.still_answers()
    client.send('{"jsonrpc":"2.0","id":"\\udfff","method":"tools/list"}')  # in the id itself: not echoed
    assert "surrogate" in client.error_for(None)["message"]
    client.still_answers()
    # raw bytes that are no UTF-8 (a surrogate encoded anyway) read as U+FFFD, as the SDK reads them: answered
    client.send(search(22, '"cat \xed\xa0\x80"').encode("latin-1"))
    assert "result" in client.wait(lambda m: m.get("id") == 22)


def test_two_requests_on_one_line_are_both_answered(client):
    client.send(client.request("tools/list", ident=31) + client.request("tools/list", ident=32))
    for ident in (31, 32):
        error = client.error_for(ident)
        assert error["code"] == INVALID_REQUEST and "2 JSON values on one line" in error["message"]
    client.still_answers()


def test_lines_that_are_not_json_rpc_get_the_specs_errors(client):
    client.send('{"jsonrpc": "2.0", "id": 41, "method": ')  # cut short: not JSON
    assert client.error_for(None)["code"] == PARSE_ERROR
    client.still_answers()
    client.send('{"jsonrpc": "2.0", "id": 42, "method": 7}')  # JSON, but no JSON-RPC request
    error = client.error_for(42)
    assert error["code"] == INVALID_REQUEST and "not a JSON-RPC 2.0 message" in error["message"]
    client.send(json.dumps([json.loads(client.request("tools/list", ident=43))]))  # a batch
    assert "batch" in client.error_for(None)["message"]
    client.still_answers()


def test_a_line_longer_than_max_body_bytes_is_skipped_and_answered(client):
    client.send(search(51, json.dumps("x" * (3 * MAX_BODY))))
    error = client.error_for(51)
    assert error["code"] == INVALID_REQUEST and f"larger than this server takes ({MAX_BODY} bytes" in error["message"]
    client.still_answers()


def test_the_checks_themselves():
    assert check_line(search(1, '"fine"')) == [] and check_line("  \n") == []
    assert top_level_id('{"params": {"id": 5, "x": [[[' + "[" * 1000) is None
    assert top_level_id('{"method": "x", "params": {"id": 5}, "id": "abc", ') == "abc"
    assert top_level_id('{"id": true}') is None and top_level_id('[{"id": 1}]') is None
    assert top_level_id('{"a": "\\"id\\"", "id": 7') == 7


def test_an_oversized_line_is_answered_once_and_its_remainder_never_read_as_lines(client):
    """The rest of a skipped line is dropped whatever it holds: no error for each piece of it, and a message that
    happens to stand at the end of it is not run."""
    hidden = client.request("tools/list", ident=53)  # after the cut: must not be answered
    client.send(f'{{"jsonrpc":"2.0","id":52,"method":"x","params":{{"pad":"{"y" * (2 * MAX_BODY)}"}}}} {hidden}')
    assert client.error_for(52)["code"] == INVALID_REQUEST
    client.still_answers()
    time.sleep(0.5)
    client.still_answers()
    stray = [m for m in client.seen if m.get("id") in (None, 53)]
    assert stray == [], stray


def test_the_checks_answer_each_message_of_a_crowded_line_up_to_the_limit_and_read_ids_at_the_top_only():
    from hugginggpt.mcp.lines import MAX_DEPTH, MAX_REPLIES, TOO_DEEP

    crowded = " ".join(json.dumps({"jsonrpc": "2.0", "id": k, "method": "ping"}) for k in range(MAX_REPLIES + 20))
    errors = check_line(crowded)
    assert [e.id for e in errors] == list(range(MAX_REPLIES))  # every one of the first 100 gets its answer
    assert top_level_id('{"method": "x", "params": {"a": 1, "id": 5}, "id": "abc"') == "abc"
    assert top_level_id('{"params": {"a": 1, "id": 5}, "x": [1, {"b": 2, "id": 6}]') is None
    # nesting: an unreadable message one level past the limit is "too deep"; at the limit, it is what it is
    for levels, deep in ((MAX_DEPTH + 1, True), (MAX_DEPTH, False)):
        line = '{"id": 3, "x": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"  # the object is a level too
        (only,) = check_line(line)
        assert only.id == 3
        assert (only.error.message == TOO_DEEP) is deep, only.error.message


def test_the_config_may_come_from_the_environment(tmp_path):
    """An MCP host's config block sets env more easily than args: $HUGGINGGPT_CONFIG names the config."""
    import os

    bad = tmp_path / "host-config.yaml"
    bad.write_text("request_timeout: soon\n")
    run = subprocess.run([sys.executable, "-m", "hugginggpt.mcp"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "HUGGINGGPT_CONFIG": str(bad)}, stdin=subprocess.DEVNULL)
    assert run.returncode == 2 and run.stdout == ""  # stdout is the protocol's
    assert run.stderr.startswith(f"config error: {bad}") and "request_timeout" in run.stderr


@pytest.fixture
def quiet_main(monkeypatch):
    """stdio.main in this process, its logging set-up and stdio serving replaced: (main, what `serve` was given)."""
    from hugginggpt import cli, logs
    from hugginggpt.mcp import stdio

    monkeypatch.setattr(logs, "setup_logging", lambda *a, **k: None)
    monkeypatch.setattr(cli, "quiet_libraries", lambda: None)
    served: list[Any] = []

    async def serve(server, max_line_bytes):
        served.append(max_line_bytes)

    monkeypatch.setattr(stdio, "serve", serve)
    monkeypatch.delenv("HUGGINGGPT_CONFIG", raising=False)
    return stdio.main, served


def local_config(folder, **extra) -> str:
    lines = ['local: {endpoint: "http://127.0.0.1:9/v1"}', "dev: true", "model: scripted", f"root: {ROOT}",
             "semantic_ranking: false", f"catalog_store: {folder / 'catalog.sqlite'}",
             *(f"{k}: {v}" for k, v in extra.items())]
    path = folder / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_main_reads_the_arguments_it_is_given_and_keeps_stdout_for_the_protocol(quiet_main, tmp_path, capsys):
    main, served = quiet_main
    config = local_config(tmp_path, nonsense_key=1, max_body_bytes=123456)
    assert main(["--config", config, "--strict"]) == 2  # --strict: an unknown key is an error
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(f"config error: {config}") and "nonsense_key" in out.err
    assert served == []
    assert main(["--config", config]) == 0  # a warning, on stderr, then it serves (bytes, not KiB)
    out = capsys.readouterr()
    assert out.out == "" and "warning:" in out.err and "nonsense_key" in out.err
    assert served == [123456]


def test_a_config_problem_found_while_building_the_engine_is_a_config_error_too(quiet_main, tmp_path, capsys):
    main, served = quiet_main
    config = local_config(tmp_path, demos_or_presteps="{parse_task: no-such-demos.json}")
    assert main(["--config", config]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: ") and "no-such-demos.json" in err and "Traceback" not in err
    assert served == []


def test_the_server_s_own_failure_is_not_a_clean_exit_and_its_warm_up_never_holds_the_exit(quiet_main, monkeypatch,
                                                                                         tmp_path):
    import threading as threads

    from hugginggpt.chat import HuggingGPT
    from hugginggpt.mcp import stdio

    main, _ = quiet_main
    warmed: list[bool] = []
    monkeypatch.setattr(HuggingGPT, "warm", lambda self: warmed.append(threads.current_thread().daemon))

    async def broken(server, max_line_bytes):
        raise RuntimeError("the transport broke")

    monkeypatch.setattr(stdio, "serve", broken)
    with pytest.raises(RuntimeError, match="the transport broke"):  # a traceback and a non-zero exit, not 0
        main(["--config", local_config(tmp_path)])
    deadline = time.monotonic() + 5
    while not warmed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert warmed == [True]  # a daemon: a host that closes stdin sees the server exit at once


def test_without_a_config_named_it_reads_the_project_s_default(quiet_main, monkeypatch, capsys):
    main, _ = quiet_main
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert main([]) == 2  # the default config needs an OpenAI key
    err = capsys.readouterr().err
    assert err.startswith("config error: configs/config.default.yaml: `openai.api_key` is missing"), err


@pytest.mark.parametrize(("line", "answers"), [
    ("[1, 2]", [(None, INVALID_REQUEST, "a JSON array is a batch, which MCP does not take; send each JSON-RPC "
                                        "message on a line of its own")]),
    ("7", [(None, INVALID_REQUEST, "a JSON-RPC message is a JSON object, got int")]),
    ('"x"', [(None, INVALID_REQUEST, "a JSON-RPC message is a JSON object, got str")]),
    ('{"jsonrpc": "2.0", "id": 4, "method": 5}', [(4, INVALID_REQUEST, "not a JSON-RPC 2.0 message: Input should be "
                                                                       "a valid string")]),
    ('{"id": 9, "jsonrpc": "1.0", "method": "m"}', [(9, INVALID_REQUEST, "not a JSON-RPC 2.0 message: Input should "
                                                                         "be '2.0'")]),
    ('{"id": 5, "x": "\\ud800"}', [(5, INVALID_REQUEST, "the message holds a lone UTF-16 surrogate (\\ud800), which "
                                                        "is not a character; send text as valid Unicode")]),
    ('{"id": 1,', [(None, PARSE_ERROR, "parse error: the line is not JSON (Expecting property name enclosed in "
                                       "double quotes at column 10); send one JSON-RPC message per line")]),
    ("nul", [(None, PARSE_ERROR, "parse error: the line is not JSON (Expecting value at column 1); send one "
                                 "JSON-RPC message per line")]),
    ('{"a": 1}\t\r {"b": 2}', [(None, INVALID_REQUEST, "2 JSON values on one line; send each JSON-RPC message on a "
                                                       "line of its own")]),
    ('{"a": 1} X {"b": 2}', [(None, PARSE_ERROR, "parse error: the line is not JSON (Extra data at column 10); send "
                                                 "one JSON-RPC message per line")]),  # only blanks part values
    ('{"jsonrpc":"2.0","id":1,"method":"a"} {"jsonrpc":"2.0","id":"two","method":"b"} {"id":3}',
     [(1, INVALID_REQUEST, "3 JSON values on one line; send each JSON-RPC message on a line of its own"),
      ("two", INVALID_REQUEST, "3 JSON values on one line; send each JSON-RPC message on a line of its own")]),
])
def test_each_unreadable_line_gets_the_spec_s_code_its_id_and_a_sentence_that_says_what_to_do(line, answers):
    assert [(e.id, e.error.code, e.error.message) for e in check_line(line)] == answers


@pytest.mark.parametrize(("text", "ident"), [
    ('{"x": [1, 2, {"id": 5, "y": 1}], "id": 7', 7),  # an id inside an array's object is not the message's
    ('{"a": {"b": [{"c": 1}, 2]}, "id": "x"', "x"),
    ('{"a": ["id", 3], "id": 8', 8),
    ('{"ID": 3, "id": 4', 4),  # member names are exact
    ('{"id": 2, "x": [[[[', 2),  # cut short after the id: still answered with it
    ('{"id": [1, 2]', None), ('{"id": {"a": 1}}', None),  # an array or object is no id
    ('{"params": {"id": 5}} ', None), ('x{"id":1}', None),
])
def test_the_id_read_from_an_unreadable_line_is_the_message_s_own(text, ident):
    assert top_level_id(text) == ident


def test_a_line_at_the_limit_is_read_and_one_byte_past_it_is_skipped_to_its_end():
    import io

    from hugginggpt.mcp.lines import CheckedLines

    def reads(data: bytes) -> list[tuple[bytes, bool]]:
        lines = CheckedLines(io.BytesIO(data), 10, None)
        out = []
        while (got := lines._read())[0]:  # noqa: SLF001
            out.append(got)
        return out

    assert reads(b"0123456789\nnext\n") == [(b"0123456789\n", False), (b"next\n", False)]  # 10 bytes and its end
    assert reads(b"0123456789") == [(b"0123456789", False)]  # 10 bytes at the end of input
    assert reads(b"0123456789A\nnext\n") == [(b"0123456789A", True), (b"next\n", False)]  # 11: skipped
    assert reads(b"0123456789AB") == [(b"0123456789A", True)]


def test_each_answered_line_is_logged_with_its_size_and_what_it_was_answered(caplog):
    import io
    import logging

    import anyio

    from hugginggpt.mcp.lines import CheckedLines

    sent: list = []

    class Errors:
        async def send(self, reply):
            sent.append(reply)

    good = '{"jsonrpc": "2.0", "id": 1, "method": "ping"}\n'
    data = ("[1]\n" + good + '{"id":1,"method":"a"} {"id":2,"method":"b"}\n' + "x" * 80 + "\n").encode()

    async def read() -> list[str]:
        return [line async for line in CheckedLines(io.BytesIO(data), 60, Errors())]

    with caplog.at_level(logging.WARNING, logger="hugginggpt.mcp.lines"):
        assert anyio.run(read) == [good]  # the one line the SDK can read, as text
    assert [r.getMessage() for r in caplog.records] == [
        "MCP stdio: answered a line of 4 bytes with a JSON array is a batch, which MCP does not take; send each "
        "JSON-RPC message on a line of its own",
        "MCP stdio: answered a line of 44 bytes with 2 errors",
        "MCP stdio: answered a line of 61 bytes with the message is larger than this server takes (60 bytes, "
        "max_body_bytes)",
    ]
    assert len(sent) == 4


def test_stdin_is_read_privately_while_serving_and_is_the_process_s_again_after_even_on_an_error():
    """While the protocol reads the client's stdin, fd 0 is the null device (a child the server starts reads
    nothing of the client's bytes); after, normal or failed, fd 0 is the client's stdin again (an embedding
    process, or the REPL that ran the server, reads on)."""
    saved = os.dup(0)
    read_end, write_end = os.pipe()
    try:
        os.dup2(read_end, 0)
        client_stdin = os.fstat(0)
        null = os.stat(os.devnull)
        for n, fails in enumerate((False, True)):
            os.write(write_end, f"line {n}\n".encode())
            with contextlib.suppress(RuntimeError), claimed_stdin() as stdin:
                assert os.fstat(0).st_rdev == null.st_rdev and os.fstat(0).st_ino == null.st_ino
                assert stdin.readline() == f"line {n}\n".encode()
                if fails:
                    raise RuntimeError("the server stopped on an error")
            now = os.fstat(0)
            assert (now.st_dev, now.st_ino) == (client_stdin.st_dev, client_stdin.st_ino), fails
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)


def test_a_client_that_closes_stdin_ends_the_server(tmp_path, llm_server, models_server, public_dir):
    """How an MCP client (Claude Desktop, the inspector) stops a stdio server: it closes the server's stdin and
    waits for it to exit; a server that stays is killed, its work lost."""
    config = write_config(tmp_path, llm_server.base_url, models_server[1], public_dir, semantic_ranking=False)
    client = StdioClient(str(config))
    try:
        client.send(client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                                  "clientInfo": {"name": "closing", "version": "1"}}, ident=0))
        assert "result" in client.wait(lambda m: m.get("id") == 0, timeout=60)
        client.send("{not json")  # an answered line: the error task has work to end too
        assert client.error_for(None)["code"] == PARSE_ERROR
        client.proc.stdin.close()
        assert client.proc.wait(15) == 0
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
