"""The entry points' logging set-up (logs.setup_logging), in-process: what an operator finds on the console and in
`log_file`. The servers call it in their own processes (tests/test_log_injection.py reads their logs)."""

from __future__ import annotations

import logging
import re
import sys

from hugginggpt.logs import SafeFormatter, escape_controls, setup_logging
from hugginggpt.requestctx import REQUEST_ID

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<rest>.*)$")


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def test_the_file_gets_every_info_line_with_its_request_id_and_the_folder_is_made(root_logger, tmp_path, capsys):
    log_file = tmp_path / "deep" / "er" / "server.log"
    setup_logging(log_file=log_file)
    log = logging.getLogger("hugginggpt.test")
    log.info("outside a request")
    token = REQUEST_ID.set("req-42")
    try:
        log.warning("inside one")
    finally:
        REQUEST_ID.reset(token)
    log.debug("not at info level")
    for handler in root_logger.handlers:
        handler.flush()
    lines = lines_of(log_file.read_text(encoding="utf-8"))
    assert [LINE.match(line)["rest"] for line in lines] == [
        "hugginggpt.test [-]: outside a request", "hugginggpt.test [req-42]: inside one"]
    assert [LINE.match(line)["level"] for line in lines] == ["INFO", "WARNING"]
    err = capsys.readouterr().err  # the console says the same
    assert "hugginggpt.test [-]: outside a request" in err and "not at info level" not in err


def test_debug_lets_debug_lines_through(root_logger, tmp_path):
    log_file = tmp_path / "server.log"
    setup_logging(debug=True, log_file=log_file)
    logging.getLogger("hugginggpt.test").debug("details")
    for handler in root_logger.handlers:
        handler.flush()
    assert "DEBUG hugginggpt.test [-]: details" in log_file.read_text(encoding="utf-8")
    assert root_logger.level == logging.DEBUG


def test_quiet_keeps_the_console_to_warnings_and_the_file_complete(root_logger, tmp_path, capsys):
    log_file = tmp_path / "server.log"
    setup_logging(quiet=True, log_file=log_file)
    log = logging.getLogger("hugginggpt.test")
    log.info("an info line")
    log.warning("a warning")
    for handler in root_logger.handlers:
        handler.flush()
    err = capsys.readouterr().err
    assert "a warning" in err and "an info line" not in err
    assert "an info line" in log_file.read_text(encoding="utf-8")


def test_without_a_file_only_the_console_is_written(root_logger, tmp_path):
    setup_logging()
    assert len(root_logger.handlers) == 1 and isinstance(root_logger.handlers[0], logging.StreamHandler)
    assert root_logger.handlers[0].stream is sys.stderr


def test_a_worker_s_tag_follows_the_level_on_every_line(root_logger, tmp_path):
    log_file = tmp_path / "server.log"
    setup_logging(log_file=log_file, tag="w1")
    logging.getLogger("hugginggpt.test").info("from a worker")
    for handler in root_logger.handlers:
        handler.flush()
    assert LINE.match(lines_of(log_file.read_text(encoding="utf-8"))[0])["rest"] == \
        "w1 hugginggpt.test [-]: from a worker"


def test_chatty_libraries_are_kept_to_warnings(root_logger):
    setup_logging(debug=True)
    for name in ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "urllib3", "waitress.queue"):
        assert logging.getLogger(name).level == logging.WARNING, name


def test_a_traceback_keeps_its_lines_indented_and_escapes_control_bytes():
    formatter = SafeFormatter("%(levelname)s %(message)s")
    try:
        raise ValueError("bad\x1b[31m value\r\nforged line")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed: %s", ("a\nb",), sys.exc_info())
    text = formatter.format(record)
    first, *rest = text.split("\n")
    assert first == "ERROR failed: a\\nb"
    assert rest and all(line.startswith("  | ") for line in rest), rest
    assert "\x1b" not in text and "\r" not in text and "\\x1b[31m value\\r" in text
    stack = formatter.formatStack("Stack (most recent call last):\n  File \"x\", line 1\n\x07bell")
    assert stack.split("\n") == ["  | Stack (most recent call last):", "  |   File \"x\", line 1", "  | \\x07bell"]


def test_every_control_character_is_escaped_and_printable_text_is_not():
    assert escape_controls("a\tb\nc\rd\x00\x7f\x85\u2028\u2029é✓") == \
        "a\\tb\\nc\\rd\\x00\\x7f\\x85\\u2028\\u2029é✓"
    assert escape_controls("".join(map(chr, range(0x20)))).count("\\") == 0x20
    assert escape_controls("\x9f\xa0") == "\\x9f\xa0"  # the last C1 control, then a no-break space
