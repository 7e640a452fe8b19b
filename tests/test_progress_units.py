"""Progress reporting in-process: the models server's Watch, its Accept rule, the orchestrator's relay and its reader
of the models server's event stream (issue 48). The servers themselves: tests/test_progress.py."""

from __future__ import annotations

import io
import json
import threading
import time

import pytest

from hugginggpt import taskprogress
from hugginggpt.backends.events import MAX_EVENT_BYTES, read_events
from hugginggpt.cancel import Cancelled
from hugginggpt.errors import BackendError
from hugginggpt.modelhost import progress
from hugginggpt.modelhost.progress_stream import failure, wants_events
from hugginggpt.taskprogress import Relay, clean


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch_with_clock(**kw):
    sent: list[dict] = []
    clock = Clock()
    return progress.Watch(sent.append, clock=clock, **kw), sent, clock


# -- the models server's Watch -------------------------------------------------------------------------------


def test_steps_carry_fraction_and_an_eta_from_the_pace_since_the_first_step():
    watch, sent, clock = watch_with_clock()
    watch.step(1, 5)  # the set-up before the first step is no step's time
    clock.now += 2.0
    watch.step(2, 5)
    clock.now += 2.0
    watch.step(3, 5)
    clock.now += 2.0
    watch.step(5, 5)
    assert sent[0] == {"phase": "running", "step": 1, "steps": 5, "fraction": 0.2}
    assert sent[1]["eta"] == 6.0  # 3 steps left at 2 s each
    assert sent[2]["eta"] == 4.0
    assert sent[3] == {"phase": "running", "step": 5, "steps": 5, "fraction": 1.0, "eta": 0.0}


def test_a_new_phase_restarts_the_pace_and_the_same_phase_twice_is_said_once():
    watch, sent, clock = watch_with_clock()
    watch.phase("queued", "behind a batch")
    watch.phase("queued", "behind a batch")
    watch.phase("queued", "another model is loading")
    watch.phase("loading")
    watch.step(1, 4)
    clock.now += 10
    watch.phase("loading")  # a second model of the call (a ControlNet's): the steps' pace starts again
    watch.step(1, 4)
    clock.now += 1
    watch.step(2, 4)
    assert [e["phase"] for e in sent] == ["queued", "queued", "loading", "running", "loading", "running", "running"]
    assert sent[0]["waiting"] == "behind a batch" and sent[1]["waiting"] == "another model is loading"
    assert "waiting" not in sent[2]
    assert sent[-1]["eta"] == 2.0  # 1 s a step since the new first step, not 11


def test_a_stopped_watch_ends_the_work_at_its_next_step_but_never_a_download():
    watch, sent, _ = watch_with_clock()
    watch.step(1, 3)
    watch.stop()
    assert watch.stopped
    with pytest.raises(Cancelled):
        watch.step(2, 3)
    watch.downloaded(10, 100)  # other requests may wait on the same download: it goes on, unreported
    assert [e.get("step") for e in sent] == [1]


def test_download_bytes_are_sent_at_most_every_gap_but_always_the_first_and_the_last():
    watch, sent, clock = watch_with_clock(byte_gap=0.25)
    watch.downloaded(10, 100)
    clock.now += 0.1
    watch.downloaded(20, 100)  # too soon
    clock.now += 0.2
    watch.downloaded(30, 100)
    clock.now += 0.01
    watch.downloaded(100, 100)  # the last reading, however soon
    watch.downloaded(5, None)  # a total not known yet
    assert [(e["bytes"], e["total_bytes"], e["fraction"]) for e in sent] == [
        (10, 100, 0.1), (30, 100, 0.3), (100, 100, 1.0)]
    clock.now += 1
    watch.downloaded(5, None)
    assert sent[-1] == {"phase": "downloading", "bytes": 5, "total_bytes": None, "fraction": None}


def test_fractions_are_capped_and_kept_to_four_places_and_a_step_count_of_zero_has_none():
    watch, sent, _ = watch_with_clock()
    watch.step(1, 3)
    watch.step(4, 3)  # a pipeline that ran one more than it said
    watch.step(1, 1)
    watch.step(1, 0)
    assert [e["fraction"] for e in sent] == [0.3333, 1.0, 1.0, None]
    watch.downloaded(1, 3)
    watch.downloaded(400, 300)  # a total that grew after the last reading
    assert [e["fraction"] for e in sent[4:]] == [0.3333, 1.0]


def test_an_eta_is_in_seconds_to_two_places_and_a_step_said_twice_makes_none():
    watch, sent, clock = watch_with_clock()
    watch.step(1, 5)
    watch.step(1, 5)  # a pipeline's callback called twice for one step: no pace from no progress
    clock.now += 0.1111
    watch.step(2, 5)
    assert "eta" not in sent[1] and sent[2]["eta"] == 0.33  # 3 steps left at 0.1111 s each


def test_the_client_leaving_is_said_in_words():
    watch, _, _ = watch_with_clock()
    watch.stop()
    with pytest.raises(Cancelled, match="^the client left while the model ran$"):
        watch.step(1, 2)
    with pytest.raises(Cancelled, match="^the client left while the model ran$"):
        watch.relay({"phase": "running", "step": 1, "steps": 2})


def test_a_download_reading_exactly_a_gap_after_the_last_is_sent_and_stands_for_its_phase():
    watch, sent, clock = watch_with_clock(byte_gap=0.25)
    watch.downloaded(10, 100)
    clock.now += 0.25
    watch.downloaded(20, 100)
    watch.phase("downloading")  # the phase the readings already said
    assert [e.get("bytes") for e in sent] == [10, 20]


def test_a_relayed_event_passes_as_it_is_and_stands_for_its_phase():
    """A Ray replica's events, passed on by the front: as they came, and a phase already said is not said again."""
    watch, sent, _ = watch_with_clock()
    event = {"phase": "queued", "waiting": "in a batch with other requests for this model"}
    watch.relay(event)
    watch.phase("queued", "in a batch with other requests for this model")
    watch.relay({"phase": "running", "step": 1, "steps": 2, "fraction": 0.5})
    assert sent == [event, {"phase": "running", "step": 1, "steps": 2, "fraction": 0.5}]


def test_a_pipeline_without_a_count_of_its_own_steps_reports_the_steps_asked():
    class Plain:  # no `_num_timesteps`: a community pipeline
        def __call__(self, prompt, num_inference_steps=1, callback_on_step_end=None):
            for i in range(num_inference_steps):
                callback_on_step_end(self, i, 999 - i, {})

    watch, sent, _ = watch_with_clock()
    with progress.watching(watch):
        pipe = Plain()
        pipe("x", 3, **progress.diffusion_steps(pipe, 3))
    assert [(e.get("step"), e.get("steps")) for e in sent] == [(None, None), (1, 3), (2, 3), (3, 3)]


def test_nobody_watching_costs_the_work_nothing_and_adds_no_arguments():
    class Pipe:
        def __call__(self, prompt, num_inference_steps=1, callback_on_step_end=None):
            pass
    assert progress.current() is None
    assert progress.diffusion_steps(Pipe(), 5) == {}
    assert progress.token_steps(5) == {}
    progress.phase("loading")  # no watch: nothing to say it to


def test_diffusion_callbacks_report_each_step_by_the_style_the_pipeline_takes():
    class NewStyle:
        _num_timesteps = 3  # img2img with strength 0.5 of 6 steps runs 3

        def __call__(self, prompt, num_inference_steps=1, callback_on_step_end=None):
            state = {"latents": 1}
            for i in range(self._num_timesteps):
                state = callback_on_step_end(self, i, 999 - i, state)
            return state

    class OldStyle:
        def __call__(self, prompt, num_inference_steps=1, callback=None, callback_steps=None):
            assert callback_steps == 1
            for i in range(num_inference_steps):
                callback(i, 999 - i, None)

    class NoCallbacks:
        def __call__(self, prompt, num_inference_steps=1):
            pass

    watch, sent, _ = watch_with_clock()
    with progress.watching(watch):
        pipe = NewStyle()
        assert pipe("x", 6, **progress.diffusion_steps(pipe, 6)) == {"latents": 1}  # the kwargs pass through
        old = OldStyle()
        old("x", 2, **progress.diffusion_steps(old, 2))
        assert progress.diffusion_steps(NoCallbacks(), 4) == {}
    assert progress.current() is None
    got = [(e.get("step"), e.get("steps")) for e in sent]
    assert got == [(None, None), (1, 3), (2, 3), (3, 3), (1, 2), (2, 2)]  # "running" once: it still runs


def test_token_steps_count_new_tokens_not_the_prompt():
    import torch

    watch, sent, _ = watch_with_clock()
    with progress.watching(watch):
        streamer = progress.token_steps(4)["streamer"]
    streamer.put(torch.tensor([[5, 6, 7, 8, 9]]))  # the prompt
    streamer.put(torch.tensor([1]))
    streamer.put(torch.tensor([[2, 3]]))  # assisted decoding: two at once
    streamer.put(torch.tensor([4]))
    streamer.end()
    assert [e.get("step") for e in sent] == [None, 1, 3, 4]
    assert sent[0] == {"phase": "running"} and all(e["steps"] == 4 for e in sent[1:])


def test_waiting_for_a_held_lock_says_queued_first_and_a_free_lock_says_nothing():
    watch, sent, _ = watch_with_clock()
    lock = threading.Lock()
    with progress.watching(watch):
        with progress.waiting_for(lock, "free"):
            assert lock.locked()
        assert not lock.locked() and sent == []
        lock.acquire()
        done = threading.Event()
        said_while_waiting: list[bool] = []

        def later():  # the other request ends its run only once this one has said it waits
            said_while_waiting.append(done.wait(2))
            lock.release()
        threading.Thread(target=later).start()

        def when_sent(event):
            sent.append(event)
            done.set()
        watch._send = when_sent
        with progress.waiting_for(lock, "the model is busy"):
            pass
    assert sent == [{"phase": "queued", "waiting": "the model is busy"}]
    assert said_while_waiting == [True]  # said while it waited, not once the wait was over
    assert not lock.locked()


# -- the Accept rule -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("accept", "wanted"), [
    ("text/event-stream", True), ("Text/Event-Stream", True), ("application/json, text/event-stream;q=0.5", True),
    ("text/event-stream; q=0", False), ("text/event-stream;q=nonsense", False), ("*/*", False), (None, False),
    ("application/json", False), ("text/*", False), ("", False),
])
def test_only_a_client_that_names_the_event_stream_gets_one(accept, wanted):
    assert wants_events(accept) is wanted


def test_a_failure_is_the_one_shot_error_body():
    assert failure("no room", 503, "no_room", {"Retry-After": "5"}) == (
        503, {"error": {"message": "no room", "type": "no_room"}}, {"Retry-After": "5"})
    assert failure("bad", 400) == (400, {"error": {"message": "bad"}}, {})


# -- the orchestrator's relay ---------------------------------------------------------------------------------


def test_clean_keeps_known_fields_with_their_types_and_drops_the_rest():
    assert clean({"phase": "running", "step": 3, "steps": 10, "fraction": 0.3, "eta": 1.234567,
                  "path": "/secret/models/x", "url": "http://10.0.0.1/", "token": "hf_x"}) == {
        "phase": "running", "step": 3, "steps": 10, "fraction": 0.3, "eta": 1.23}
    assert clean({"phase": "exploding"}) is None
    assert clean(["running"]) is None
    assert clean({"phase": "running", "step": True, "steps": -1, "fraction": float("nan"), "eta": float("inf")}) \
        == {"phase": "running"}
    assert clean({"phase": "downloading", "bytes": 5, "total_bytes": 10, "fraction": 7}) == {
        "phase": "downloading", "bytes": 5, "total_bytes": 10, "fraction": 1.0}
    assert clean({"phase": "queued", "waiting": "x" * 500})["waiting"] == "x" * taskprogress.MAX_WAITING
    assert clean({"phase": "queued", "waiting": 7}) == {"phase": "queued"}
    # every door shows `waiting` on one line: a peer's line breaks and escape sequences become single spaces
    assert clean({"phase": "queued", "waiting": "behind 2\r\nretrying\x1b[2J\x9b\tnow"})["waiting"] == \
        "behind 2 retrying [2J now"
    # made one line first, then cut: the 200 characters a client sees are 200 of the cleaned sentence
    assert clean({"phase": "queued", "waiting": "a\r\n" * 100})["waiting"] == "a " * 100


def test_the_relay_sends_phase_changes_and_last_steps_at_once_and_other_steps_at_most_once_an_interval():
    sent: list[dict] = []
    clock = Clock()
    relay = Relay(sent.append, interval=1.0, clock=clock)
    relay({"phase": "loading"})
    relay({"phase": "running", "step": 1, "steps": 4})  # a new phase
    clock.now += 0.5
    relay({"phase": "running", "step": 2, "steps": 4})  # too soon
    clock.now += 0.6
    relay({"phase": "running", "step": 3, "steps": 4})  # an interval since the last one sent
    clock.now += 0.1
    relay({"phase": "running", "step": 4, "steps": 4})  # the last step, however soon
    relay({"phase": "bogus"})
    relay({"phase": "downloading", "bytes": 1, "total_bytes": 9})
    relay({"phase": "downloading", "bytes": 9, "total_bytes": 9})
    assert [(e["phase"], e.get("step"), e.get("bytes")) for e in sent] == [
        ("loading", None, None), ("running", 1, None), ("running", 3, None), ("running", 4, None),
        ("downloading", None, 1), ("downloading", None, 9)]


def test_an_interval_of_zero_relays_every_step():
    sent: list[dict] = []
    relay = Relay(sent.append, interval=0.0, clock=Clock())
    for k in range(1, 6):
        relay({"phase": "running", "step": k, "steps": 9})
    assert [e["step"] for e in sent] == [1, 2, 3, 4, 5]


def test_a_report_goes_to_the_listener_of_its_context_only():
    heard: list[dict] = []
    taskprogress.report({"phase": "loading"})  # nobody listens
    with taskprogress.listening(heard.append):
        assert taskprogress.listener() is not None
        taskprogress.report({"phase": "running"})
    taskprogress.report({"phase": "queued"})
    assert heard == [{"phase": "running"}] and taskprogress.listener() is None


# -- reading the models server's stream ----------------------------------------------------------------------


class FakeResponse:
    """What read_events uses of urllib3's HTTPResponse: status, headers, line iteration, read()."""

    def __init__(self, body: bytes, content_type: str = "text/event-stream", status: int = 200):
        self.status = status
        self.headers = {"Content-Type": content_type}
        self._body = body

    def __iter__(self):
        return iter(io.BytesIO(self._body))

    def read(self) -> bytes:
        return self._body


def stream(*events: tuple[str, object]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def test_progress_goes_to_the_listener_and_the_result_is_the_answer():
    heard: list[dict] = []
    body = b": keep-alive\n\n" + stream(("progress", {"phase": "loading"}),
                                        ("progress", {"phase": "running", "step": 1, "steps": 2})) \
        + b"event: progress\r\ndata: not json\r\n\r\n" + stream(("result", {"path": "/images/a.png"}),
                                                                 ("progress", {"phase": "late"}))
    status, data = read_events(FakeResponse(body), heard.append)
    assert (status, json.loads(data)) == (200, {"path": "/images/a.png"})
    assert heard == [{"phase": "loading"}, {"phase": "running", "step": 1, "steps": 2}]


def test_an_error_event_is_the_one_shot_error_with_its_status():
    status, data = read_events(FakeResponse(stream(("error", {"error": {"message": "no room"}, "status": 503}))),
                               lambda e: None)
    assert (status, json.loads(data)) == (503, {"error": {"message": "no room"}})
    for odd in ({"error": {"message": "x"}, "status": 200}, {"error": {"message": "x"}, "status": "503"},
                {"error": {"message": "x"}, "status": True}, {"error": {"message": "x"}}):
        assert read_events(FakeResponse(stream(("error", odd))), lambda e: None)[0] == 500
    assert read_events(FakeResponse(b"event: error\ndata: {broken\n\n"), lambda e: None) == (500, b"{broken")


def test_a_listener_that_fails_does_not_fail_the_call():
    def broken(event):
        raise RuntimeError("the stream to the user is gone")
    body = stream(("progress", {"phase": "loading"}), ("result", {"ok": 1}))
    assert read_events(FakeResponse(body), broken) == (200, b'{"ok": 1}')


def test_a_server_that_answers_json_is_read_as_before_and_a_stream_without_an_answer_is_an_error():
    plain = FakeResponse(b'{"error": {"message": "unknown model"}}', "application/json; charset=utf-8", 404)
    assert read_events(plain, lambda e: None) == (404, b'{"error": {"message": "unknown model"}}')
    with pytest.raises(BackendError, match="without an answer"):
        read_events(FakeResponse(stream(("progress", {"phase": "loading"}))), lambda e: None)


def test_an_event_past_the_size_limit_is_refused(monkeypatch):
    import hugginggpt.backends.events as events

    monkeypatch.setattr(events, "MAX_EVENT_BYTES", 10)
    with pytest.raises(BackendError, match="larger than"):
        read_events(FakeResponse(b"event: result\ndata: 0123456789ABC\n\n"), lambda e: None)
    assert MAX_EVENT_BYTES > 2**20
    assert read_events(FakeResponse(b"event: result\ndata: 012345678\n\n"), lambda e: None) == (200, b"012345678")


def test_data_lines_join_and_a_last_event_without_its_blank_line_still_counts():
    body = b"event: result\ndata: [1,\ndata: 2]"
    assert read_events(FakeResponse(body), lambda e: None) == (200, b"[1,\n2]")


def test_the_progress_interval_is_read_in_milliseconds_and_checked(tmp_path):
    from hugginggpt.config import load_config
    from hugginggpt.errors import ConfigError

    path = tmp_path / "c.yaml"
    path.write_text("openai: {api_key: unused}\n")
    assert load_config(path, need_llm=False, env={}).progress_interval_ms == 250.0
    for value, want in (("0", 0.0), ("1000", 1000.0), ("12.5", 12.5)):
        path.write_text(f"openai: {{api_key: unused}}\nprogress_interval_ms: {value}\n")
        config = load_config(path, need_llm=False, env={})
        assert config.progress_interval_ms == want and not config.warnings
    for bad in ("-1", "1001", "'often'", "true", ".nan"):
        path.write_text(f"openai: {{api_key: unused}}\nprogress_interval_ms: {bad}\n")
        with pytest.raises(ConfigError, match=r"`progress_interval_ms` must be a number of milliseconds from 0 to "
                                              r"1000 \(default 250\)"):
            load_config(path, need_llm=False, env={})


# -- MCP progress notifications -------------------------------------------------------------------------------


def test_mcp_progress_is_the_request_s_share_done_only_ever_rises_and_ends_at_one():
    from hugginggpt.mcp.progress import ToolProgress

    p = ToolProgress()
    draw, speak = {"id": 0, "task": "text-to-image"}, {"id": 1, "task": "text-to-speech"}
    assert p.note("plan", {"tasks": [{"id": 0}, {"id": 1}]}) is None
    assert p.note("task_started", draw) == (0.01, 1.0, "#0 text-to-image: started")  # a start shows
    assert p.note("task_progress", {**draw, "phase": "loading"}) is None  # no share of its steps yet
    assert p.note("task_progress", {**draw, "phase": "running", "step": 1, "steps": 4, "fraction": 0.25}) == (
        0.13, 1.0, "#0 text-to-image: step 1 of 4")  # (0.02 + 0.96 * 0.25) / 2
    assert p.note("task_started", speak)[0] == 0.14
    assert p.note("task_progress", {**speak, "phase": "downloading", "bytes": 5, "total_bytes": 10,
                                    "fraction": 0.5}) is None  # bytes are no share of steps
    assert p.note("task_progress", {**speak, "phase": "running", "step": 1, "steps": 2, "fraction": 0.5})[0] == 0.38
    assert p.note("task_finished", draw) == (0.75, 1.0, "#0 text-to-image: done")  # an end shows
    last_step = p.note("task_progress", {**speak, "phase": "running", "step": 2, "steps": 2, "fraction": 1.0})
    assert last_step[0] == 0.99  # the last step is not the end: decoding and saving are still to come
    assert p.note("task_progress", {**speak, "phase": "running", "fraction": 1.0}) is None  # no rise
    assert p.note("task_finished", speak) == (1.0, 1.0, "#1 text-to-speech: done")  # and the end is 1.0
    failed = ToolProgress()
    failed.note("plan", {"tasks": [{"id": 0}, {"id": 1}]})
    assert failed.note("task_failed", {"id": 0, "task": "a"}) == (0.5, 1.0, "#0 a: failed")
    assert failed.note("task_failed", {"id": 1, "task": "b", "skipped": True}) == (1.0, 1.0, "#1 b: skipped")
    one = ToolProgress()  # run_model: one task, no plan
    assert one.note("task_progress", {"id": 0, "task": "t", "phase": "running", "fraction": 0.5})[0] == 0.5
    assert one.note("task_progress", {"id": 0, "task": "t", "phase": "running", "fraction": 0.4}) is None
    assert one.note("task_progress", {"id": 0, "task": "t", "phase": "running", "fraction": True}) is None
    assert one.note("task_progress", {"id": 0, "task": "t", "phase": "running", "fraction": 7})[0] == 0.98
    assert one.note("task_finished", {"id": 0, "task": "t"})[0] == 1.0


def test_run_reporting_sends_notes_from_the_sdk_thread_and_hands_back_the_result_or_the_error():
    import anyio
    import anyio.to_thread

    from hugginggpt.mcp import progress as tool_progress

    sent: list[tuple] = []

    async def report(progress, total, message):
        sent.append((progress, total, message, threading.current_thread().name))

    def work():
        listen = tool_progress.events()
        listen("plan", {"tasks": [{"id": 0}]})
        for k in (1, 2):
            threading.Thread(target=listen, args=("task_progress", {  # the request's own threads
                "id": 0, "task": "t", "phase": "running", "step": k, "steps": 2, "fraction": k / 2})).start()
            time.sleep(0.05)
        return "the result"

    def failing():
        raise ValueError("the tool failed")

    async def main():
        value = await anyio.to_thread.run_sync(lambda: tool_progress.run_reporting(work, report))
        with pytest.raises(ValueError, match="the tool failed"):
            await anyio.to_thread.run_sync(lambda: tool_progress.run_reporting(failing, report))

        async def gone(*args):
            raise anyio.BrokenResourceError("the client left")  # what a closed session's stream raises
        survived = await anyio.to_thread.run_sync(lambda: tool_progress.run_reporting(work, gone))
        return value, survived

    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(anyio.run(main)), daemon=True)
    runner.start()
    runner.join(20)  # a tool call whose work raised must end too, not wait for ever for its notes
    assert outcome == [("the result", "the result")]
    assert [(p, t, m) for p, t, m, _ in sent] == [(0.5, 1.0, "#0 t: step 1 of 2"), (0.98, 1.0, "#0 t: step 2 of 2 · finishing")]
    assert tool_progress.events() is None  # outside a reporting call nobody listens


# -- the models server's stream of one call --------------------------------------------------------------------


def stream_of(call, disconnected=None) -> list[str]:
    from hugginggpt.modelhost.progress_stream import stream_call

    return list(stream_call(call, disconnected, name="test-call").response)


def test_a_call_silent_for_a_while_behind_a_server_without_a_disconnect_hook_still_answers():
    def slow():
        time.sleep(1.2)  # a load or a long step: no event for over a second
        return 200, {"path": "/images/a.png"}, {}

    assert stream_of(slow)[-1] == 'event: result\ndata: {"path":"/images/a.png"}\n\n'


def test_a_failure_that_escapes_the_call_says_its_kind_and_nothing_of_its_text():
    def broken():
        raise OSError("/home/me/.cache/huggingface/hub/models--x/blobs/abc: No space left on device")

    last = stream_of(broken)[-1]
    assert last.startswith("event: error\n")
    assert json.loads(last.split("data: ", 1)[1]) == {"error": {"message": "internal error (OSError)"}, "status": 500}


def test_a_client_gone_during_a_silent_wait_stops_the_work():
    from hugginggpt.modelhost import progress as prog

    stopped = threading.Event()

    def waits():
        watch = prog.current()
        for _ in range(100):  # a queue: nothing to say until the model is free
            if watch.stopped:
                stopped.set()
                return 499, {"error": {"message": "stopped"}}, {}
            time.sleep(0.05)
        return 200, {}, {}

    assert stream_of(waits, disconnected=lambda: True) == []  # the client is gone: nothing is sent
    assert stopped.wait(5)


def test_progress_in_words_as_the_cli_and_gradio_show_it():
    from hugginggpt.taskprogress import describe

    assert describe({"phase": "running", "step": 10, "steps": 25, "eta": 3.2}) == "step 10 of 25 · about 4 s left"
    assert describe({"phase": "running", "step": 1, "steps": 25, "eta": 150}) == "step 1 of 25 · about 2 min left"
    assert describe({"phase": "running", "step": 1, "steps": 25, "eta": 89.5}) == "step 1 of 25 · about 90 s left"
    assert describe({"phase": "downloading", "bytes": 312_000_000, "total_bytes": 1_719_300_000}) == \
        "downloading 312.0 of 1719.3 MB"  # MB as the models server's own messages count them
    assert describe({"phase": "downloading", "bytes": 5_000_000}) == "downloading 5.0 MB"
    assert describe({"phase": "queued", "waiting": "another model is loading"}) == "queued: another model is loading"
    assert describe({"phase": "loading"}) == "loading the model"
    assert describe({"phase": "running"}) == "running"


def test_a_new_reason_to_wait_is_relayed_at_once():
    sent: list[dict] = []
    relay = Relay(sent.append, interval=10.0, clock=Clock())
    relay({"phase": "queued", "waiting": "in a batch with other requests for this model"})
    relay({"phase": "queued", "waiting": "another model is loading"})  # within the interval, but news
    relay({"phase": "queued", "waiting": "another model is loading"})
    assert [e["waiting"] for e in sent] == ["in a batch with other requests for this model",
                                            "another model is loading"]


def test_the_interval_runs_from_the_last_event_sent_not_from_the_phase_change():
    sent: list[dict] = []
    clock = Clock()
    relay = Relay(sent.append, interval=1.0, clock=clock)
    relay({"phase": "running", "step": 1, "steps": 50})
    for k in range(2, 40):  # a step every 0.25 s: one in four is sent
        clock.now += 0.25
        relay({"phase": "running", "step": k, "steps": 50})
    assert [e["step"] for e in sent] == [1, 5, 9, 13, 17, 21, 25, 29, 33, 37]


def test_mcp_progress_counts_a_finished_task_once_and_a_smaller_replan_never_inflates_the_share():
    from hugginggpt.mcp.progress import ToolProgress

    p = ToolProgress()
    p.note("plan", {"tasks": [{"id": 0}, {"id": 1}]})
    # its last step (0.98 of its share): its end is still to come
    assert p.note("task_progress", {"id": 0, "task": "a", "phase": "running", "fraction": 1.0})[0] == 0.49
    p.note("task_finished", {"id": 0})
    assert p.note("task_progress", {"id": 1, "task": "b", "phase": "running", "fraction": 0.5})[0] == 0.75
    q = ToolProgress()
    q.note("plan", {"tasks": [{"id": k} for k in range(4)]})
    q.note("task_finished", {"id": 0})
    q.note("replan", {"tasks": [{"id": 1}]})  # the rest replaced by one task: still a request of four
    assert q.note("task_progress", {"id": 1, "task": "b", "phase": "running", "fraction": 0.5})[0] == 0.375


def test_mcp_progress_counts_a_failed_task_as_done():
    from hugginggpt.mcp.progress import ToolProgress

    p = ToolProgress()
    p.note("plan", {"tasks": [{"id": 0}, {"id": 1}]})
    p.note("task_failed", {"id": 0, "error": "the model failed"})
    assert p.note("task_progress", {"id": 1, "task": "b", "phase": "running", "fraction": 0.5})[0] == 0.75


def test_the_cli_takes_a_task_s_progress_line_off_when_it_fails_or_ends():
    import io

    from hugginggpt.cli import Turn, progress_printer

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    show = progress_printer(out, Turn(), threading.Event())
    show("task_progress", {"id": 0, "task": "text-to-image", "phase": "running", "step": 3, "steps": 25, "t": 1.0})
    show("task_progress", {"id": 1, "task": "text-to-speech", "phase": "loading", "t": 1.1})
    show("task_failed", {"id": 0, "task": "text-to-image", "error": "the model failed", "t": 1.2})
    show("task_finished", {"id": 1, "task": "text-to-speech", "result": {}, "seconds": 0.5, "t": 1.3})
    show("plan", {"tasks": [], "t": 1.4})
    text = out.getvalue()
    after_failure = text[text.index("#0 text-to-image failed: the model failed"):]
    assert "#0 text-to-image: step" not in after_failure  # its line is gone, not redrawn under later lines
    assert "#1 text-to-speech: loading the model" in text and "#1 text-to-speech: loading" not in \
        text[text.index("#1 text-to-speech done"):]
    assert text.endswith("plan: \n")  # nothing drawn below the last line once no task runs


# -- the outbox between a call's thread and its stream ------------------------------------------------------------


def test_steps_made_close_together_leave_in_one_write_in_order_and_the_first_at_once():
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=0.3)
    box.put("progress", {"step": 1})
    t0 = time.monotonic()
    assert box.take(5) == ([("progress", {"step": 1})], False)  # nothing before it: it leaves at once
    assert time.monotonic() - t0 < 0.2
    for k in range(2, 26):  # a tiny pipeline's steps, a few ms apart: each would be a write of its own
        box.put("progress", {"step": k})
    items, answered = box.take(5)
    assert time.monotonic() - t0 >= 0.25  # held until the gap since the last write has passed
    assert [data["step"] for _, data in items] == list(range(2, 26)) and not answered


def test_the_answer_leaves_at_once_with_the_steps_that_wait_and_ends_the_stream():
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=5.0)
    box.put("progress", {"step": 1})
    box.take(1)
    box.put("progress", {"step": 2})
    box.close("result", {"path": "/images/a.png"})
    t0 = time.monotonic()
    assert box.take(10) == ([("progress", {"step": 2}), ("result", {"path": "/images/a.png"})], True)
    assert time.monotonic() - t0 < 1.0  # not held for the 5 s gap


def test_a_silent_call_s_outbox_answers_nothing_when_the_wait_is_over():
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=0.0)
    t0 = time.monotonic()
    assert box.take(0.3) == ([], False)
    assert 0.25 <= time.monotonic() - t0 < 2.0


def test_a_step_made_while_the_stream_waits_wakes_it_without_waiting_for_its_check():
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=0.05)
    box.take(0.01)
    got: list = []
    reader = threading.Thread(target=lambda: got.append((box.take(30), time.monotonic())))
    reader.start()
    time.sleep(0.2)
    sent_at = time.monotonic()
    box.put("progress", {"step": 1})
    reader.join(10)
    (items, _), at = got[0]
    assert items == [("progress", {"step": 1})] and at - sent_at < 1.0


def test_a_step_made_soon_after_a_write_leaves_when_the_gap_is_over_not_at_the_next_check():
    """The stream waits for its next check (0.5 s in the server; 5 s here) when nothing is pending: the first
    event after a write must wake it, to leave as soon as the gap allows."""
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=0.3)
    box.put("progress", {"step": 1})
    assert box.take(1)[0] == [("progress", {"step": 1})]
    wrote = time.monotonic()
    got: list = []
    reader = threading.Thread(target=lambda: got.append((box.take(5), time.monotonic())))
    reader.start()
    time.sleep(0.05)  # the reader waits with nothing pending
    box.put("progress", {"step": 2})
    reader.join(10)
    (items, _), at = got[0]
    assert items == [("progress", {"step": 2})]
    assert 0.25 <= at - wrote < 1.5  # held for the gap, then sent: not at the reader's 5 s check


def test_a_change_of_phase_starts_no_gap_so_the_first_step_leaves_as_soon_as_it_is_made():
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=5.0)
    t0 = time.monotonic()
    box.put("progress", {"phase": "loading"})
    assert box.take(10)[0] == [("progress", {"phase": "loading"})]
    box.put("progress", {"phase": "running"})
    assert box.take(10)[0] == [("progress", {"phase": "running"})]
    box.put("progress", {"phase": "running", "step": 1, "steps": 25})
    assert box.take(10)[0] == [("progress", {"phase": "running", "step": 1, "steps": 25})]
    box.put("progress", {"phase": "downloading", "bytes": 10, "total_bytes": 100})  # after a step: held
    assert box.take(0.5) == ([], False)
    assert time.monotonic() - t0 < 2.0


def test_the_answer_wakes_a_stream_waiting_with_nothing_to_send():
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=0.05)
    got: list = []
    reader = threading.Thread(target=lambda: got.append((box.take(5), time.monotonic())))
    reader.start()
    time.sleep(0.1)
    answered = time.monotonic()
    box.close("result", {"path": "/images/a.png"})
    reader.join(10)
    (items, done), at = got[0]
    assert items == [("result", {"path": "/images/a.png"})] and done
    assert at - answered < 1.0  # at once, not at the stream's next check


def test_a_zero_is_a_reading_not_a_missing_one():
    """The first reading of a download is 0 bytes of its total; a run about to end has 0 s left."""
    from hugginggpt.taskprogress import clean, describe

    assert clean({"phase": "downloading", "bytes": 0, "total_bytes": 0, "fraction": 0}) == \
        {"phase": "downloading", "bytes": 0, "total_bytes": 0, "fraction": 0.0}
    assert clean({"phase": "running", "step": 0, "steps": 25, "eta": 0}) == \
        {"phase": "running", "step": 0, "steps": 25, "eta": 0.0}
    assert describe(clean({"phase": "running", "step": 25, "steps": 25, "eta": 0})) == "step 25 of 25 · finishing"
    assert describe(clean({"phase": "running", "step": 0, "steps": 25})) == "step 0 of 25"  # a generator's start


def test_a_fraction_is_kept_to_four_places():
    from hugginggpt.taskprogress import clean

    assert clean({"phase": "running", "fraction": 0.123456})["fraction"] == 0.1235
    assert clean({"phase": "running", "fraction": 2 / 3})["fraction"] == 0.6667


def test_a_stream_is_an_event_stream_no_proxy_buffers_or_caches():
    from hugginggpt.modelhost.progress_stream import stream_call

    resp = stream_call(lambda: (200, {"path": "/images/a.png"}, {}), None, name="test-call")
    assert resp.mimetype == "text/event-stream"
    assert resp.headers["Cache-Control"] == "no-cache" and resp.headers["X-Accel-Buffering"] == "no"
    assert list(resp.response) == ['event: result\ndata: {"path":"/images/a.png"}\n\n']


def test_steps_sent_together_are_still_one_event_each_then_the_answer_or_the_error_with_its_status():
    def steps_then(status, payload):
        def call():
            watch = progress.current()
            for k in (1, 2, 3):
                watch.step(k, 3)
            return status, payload, {}
        return call

    text = "".join(stream_of(steps_then(200, {"path": "/images/a.png"})))
    events = [block for block in text.split("\n\n") if block]
    assert [e.split("\n")[0] for e in events] == ["event: progress"] * 3 + ["event: result"]
    assert [json.loads(e.split("data: ", 1)[1]).get("step") for e in events[:3]] == [1, 2, 3]
    text = "".join(stream_of(steps_then(503, {"error": {"message": "no room", "type": "no_room"}})))
    last = [block for block in text.split("\n\n") if block][-1]
    assert last.startswith("event: error\n")
    assert json.loads(last.split("data: ", 1)[1]) == {"error": {"message": "no room", "type": "no_room"}, "status": 503}


def test_a_failure_that_escapes_the_call_is_logged_with_its_traceback(caplog):
    def broken():
        raise RuntimeError("deep inside the pipeline")

    with caplog.at_level("ERROR", logger="hugginggpt.modelhost.progress_stream"):
        stream_of(broken)
    records = [r for r in caplog.records if r.name == "hugginggpt.modelhost.progress_stream"]
    assert [r.getMessage() for r in records] == ["a streamed call failed"] and records[0].exc_info[0] is RuntimeError


def test_a_long_silence_gets_keep_alive_comments_and_an_event_starts_the_count_again():
    from hugginggpt.modelhost.progress_stream import stream_call

    def slow():
        time.sleep(2.2)  # a load: nothing to say for a while
        progress.current().phase("running")
        time.sleep(0.7)  # under the keep-alive interval since the last event: no comment
        return 200, {"ok": True}, {}

    started = time.monotonic()
    timed = [(chunk, time.monotonic() - started)
             for chunk in stream_call(slow, None, name="test-call", keep_alive=1.0).response]
    chunks = [chunk for chunk, _ in timed]
    assert chunks[:2] == [": keep-alive\n\n", ": keep-alive\n\n"]  # at 1 s and 2 s of silence
    assert 0.9 <= timed[0][1] < 1.6, timed  # a full interval of silence first
    assert chunks[2:] == ['event: progress\ndata: {"phase":"running"}\n\n', 'event: result\ndata: {"ok":true}\n\n']


def test_a_task_whose_call_raised_leaves_no_listener_behind():
    """The next call on this thread (another task's) must not report to the failed task's listener."""
    heard: list[dict] = []
    with pytest.raises(BackendError):
        with taskprogress.listening(heard.append):
            raise BackendError("the model failed")
    taskprogress.report({"phase": "running", "step": 1, "steps": 2})
    assert heard == []


def test_a_download_reading_starts_the_write_gap_as_a_step_does():
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=5.0)
    box.put("progress", {"phase": "downloading", "bytes": 10, "total_bytes": 100})
    assert box.take(1)[0] == [("progress", {"phase": "downloading", "bytes": 10, "total_bytes": 100})]
    box.put("progress", {"phase": "downloading", "bytes": 20, "total_bytes": 100})
    assert box.take(0.3) == ([], False)  # held for the gap


def test_an_idle_stream_sleeps_while_it_waits():
    """After a write, with nothing to send, the wait is a sleep until the next check, not a loop."""
    from hugginggpt.modelhost.progress_stream import Outbox

    box = Outbox(gap=0.01)
    box.put("progress", {"step": 1})
    box.take(1)
    time.sleep(0.05)  # the gap is over, nothing is pending
    cpu = time.thread_time()
    assert box.take(0.5) == ([], False)
    assert time.thread_time() - cpu < 0.2


@pytest.mark.parametrize("accept, wanted", [("text/event-stream;level=1;q=0", False),
                                            ("text/event-stream;q=0=1", False),
                                            ("text/event-stream; charset=utf-8; q=0.5", True)])
def test_the_quality_is_read_among_other_parameters(accept, wanted):
    assert wants_events(accept) is wanted
