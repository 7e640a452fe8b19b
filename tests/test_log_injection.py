"""Log injection (issue 20, item 6): a value that reaches the log cannot forge a line nor carry control bytes."""

from __future__ import annotations

import logging
import re

from hugginggpt.logs import SafeFormatter, escape_controls
from tests.conftest import start_server, stop_server, write_config

FORGED = "2026-01-01 00:00:00 INFO forged"
HOSTILE = f"caption this\n{FORGED}\r\n{FORGED} again \x1b[31mred\x1b[0m \x00nul \u2028sep \x7f end"
LINE_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ")


def assert_clean(text: str) -> None:
    lines = text.splitlines()
    assert not any(line.startswith(FORGED) for line in lines), "a forged line"
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029]", text), "a raw control character"


def test_a_hostile_request_text_forges_no_line_and_no_escape_sequence(tmp_path, models_server, public_dir):
    _, models_url = models_server
    log_file = tmp_path / "logs" / "server.log"
    config = write_config(tmp_path, "http://127.0.0.1:9", models_url, public_dir, log_file=str(log_file),
                          semantic_ranking=False)
    srv = start_server(config, tmp_path)
    try:
        resp = srv.post("/tasks", {"messages": [{"role": "user", "content": HOSTILE}]})
        assert resp.status_code == 502  # the LLM is down; the request was logged on its way in
    finally:
        stop_server(srv)
    text = log_file.read_text(encoding="utf-8")
    logged = [line for line in text.splitlines() if "caption this" in line]
    assert len(logged) == 1 and "\\nforged" not in logged[0]
    assert f"\\n{FORGED}\\r\\n{FORGED} again \\x1b[31mred" in logged[0]  # escaped, readable, on one line
    assert_clean(text)
    assert_clean(srv.logs())  # the console output too


def test_every_record_is_one_line_and_tracebacks_stay_under_their_record():
    formatter = SafeFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "got %s", (HOSTILE,), None)
    line = formatter.format(record)
    assert "\n" not in line and LINE_START.match(line) and "\\x00nul" in line and "\\u2028sep" in line
    try:
        raise ValueError(f"bad\n{FORGED}\x1b")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
    text = formatter.format(record)
    first, *rest = text.split("\n")
    assert LINE_START.match(first) and rest and all(line.startswith("  | ") for line in rest)
    assert_clean(text)
    assert escape_controls("a\tb\x9bc") == "a\\tb\\x9bc"
