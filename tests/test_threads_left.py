"""A request answered in one piece leaves no thread behind: after a thousand requests the orchestrator runs as
many threads as it did after ten (a leak of one thread per request would show as a thousand more)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from tests.conftest import start_server, stop_server, write_config


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count in /proc")


def test_a_thousand_one_piece_requests_leave_the_thread_count_where_ten_left_it(tmp_path, llm, models_server,
                                                                                   public_dir):
    _, models_url = models_server
    llm.on("parse_task", json.dumps([{"task": "token-classification", "id": 0, "dep": [-1],
                                      "args": {"text": "Anna lives in Berlin"}}]))
    llm.on("choose_model", json.dumps({"id": "dslim/bert-base-NER", "reason": "the one"}))
    llm.on("response_results", "Anna is a person.")
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False), tmp_path)
    body = {"messages": [{"role": "user", "content": "find the names in 'Anna lives in Berlin'"}]}
    session = requests.Session()

    def ask(_: int) -> int:
        return session.post(f"{srv.url}/hugginggpt", json=body, timeout=60).status_code

    try:
        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(ask, range(10))) == {200}
            time.sleep(0.5)  # the pools' idle threads settle
            after_ten = threads_of(srv.proc.pid)
            assert set(pool.map(ask, range(1000))) == {200}
        deadline = time.monotonic() + 10
        while (after_thousand := threads_of(srv.proc.pid)) > after_ten and time.monotonic() < deadline:
            time.sleep(0.2)  # a request's threads end just after its answer is sent
    finally:
        stop_server(srv)
    assert after_thousand <= after_ten, (after_ten, after_thousand)
