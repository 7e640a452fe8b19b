"""Edge cases of hugginggpt/planstream.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import json

import pytest

from hugginggpt.plan import Task
from hugginggpt.planstream import EarlyTasks, ObjectStream


def draw(tid: int, text: str = "a fox") -> dict:
    return {"task": "text-to-image", "id": tid, "dep": [-1], "args": {"text": text}}


def caption(tid: int, ref: int) -> dict:
    return {"task": "image-to-text", "id": tid, "dep": [ref], "args": {"image": f"<GENERATED>-{ref}"}}


def feed_in_pieces(stream, text: str, size: int) -> list[str]:
    return [obj for i in range(0, len(text), size) for obj in stream.feed(text[i:i + size])]


# -- ObjectStream ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_each_task_object_is_found_once_whatever_the_pieces(size):
    plan = [draw(0), caption(1, 0), {"task": "object-detection", "id": 2, "args": {"image": "/a [b] {c}.png"}}]
    text = 'Sure {"note": {"x": 2}} here: ' + json.dumps(plan) + ' and {"after": 1}'
    found = feed_in_pieces(ObjectStream(), text, size)
    assert [json.loads(o) for o in found] == plan


def test_objects_nested_inside_a_task_or_a_deeper_array_are_not_tasks():
    text = '[{"task": "a", "args": {"x": {"y": 1}}, "list": [{"z": 2}]}, [{"inner": 3}], {"task": "b"}]'
    found = ObjectStream().feed(text)
    assert [json.loads(o) for o in found] == [{"task": "a", "args": {"x": {"y": 1}}, "list": [{"z": 2}]},
                                             {"task": "b"}]


def test_the_task_list_may_sit_in_an_object():
    text = '{"thoughts": "x", "tasks": [{"id": 0}, {"id": 1, "args": {"a": [1]}}]}'
    assert [json.loads(o) for o in feed_in_pieces(ObjectStream(), text, 3)] == [{"id": 0}, {"id": 1, "args": {"a": [1]}}]


def test_braces_and_quotes_inside_strings_do_not_count():
    text = r'[{"t": "a } ] and a { [ and \" quote"}, {"t": "ends with a backslash \\"}, {"t": "\\\" }"}]'
    found = feed_in_pieces(ObjectStream(), text, 1)
    assert [json.loads(o)["t"] for o in found] == ['a } ] and a { [ and " quote', "ends with a backslash \\",
                                                  '\\" }']


@pytest.mark.parametrize("size", [1, 1000])
def test_an_empty_string_first_is_a_whole_string(size):
    """The reply's first quoted text may be empty; its closing quote is not an escaped character."""
    text = 'Answer "" ok: [{"t": "", "id": 0}, {"t": "[", "id": 1}]'
    assert [json.loads(o)["id"] for o in feed_in_pieces(ObjectStream(), text, size)] == [0, 1]


def test_an_unfinished_object_is_not_reported_until_its_brace_closes():
    stream = ObjectStream()
    assert stream.feed('[{"id": 0}, {"id": 1, "args": {"text": "x"}') == ['{"id": 0}']
    assert stream.feed("") == []
    assert stream.feed("}, ") == ['{"id": 1, "args": {"text": "x"}}']


def test_objects_before_any_array_are_not_tasks():
    assert ObjectStream().feed('{"id": 0} {"id": 1} [') == []


@pytest.mark.parametrize("size", [1, 1000])
def test_arrays_after_the_task_list_hold_no_tasks(size):
    text = '[{"id": 0}] You could also ask for: [{"id": 1}, {"id": 2}]'
    assert feed_in_pieces(ObjectStream(), text, size) == ['{"id": 0}']
    text = '{"tasks": [{"id": 0}, {"id": 1}], "examples": [{"id": 2}]} [{"id": 3}]'
    assert [json.loads(o)["id"] for o in feed_in_pieces(ObjectStream(), text, size)] == [0, 1]


@pytest.mark.parametrize("prose", ["Step 1] and 2}: ", "Step 1]: ", "{ note: "])
def test_a_stray_bracket_before_the_plan_changes_nothing(prose):
    assert [json.loads(o)["id"] for o in ObjectStream().feed(prose + '[{"id": 0}, {"id": 1}]')] == [0, 1]


def test_a_mismatched_bracket_in_the_task_list_is_skipped_not_a_crash():
    """`[` closed by `}` between tasks (a garbled reply) is not a task; the tasks around it still are."""
    text = '[[}, {"id": 0}, [}, {"id": 1}]'
    assert [json.loads(o)["id"] for o in feed_in_pieces(ObjectStream(), text, 1)] == [0, 1]


# -- EarlyTasks --------------------------------------------------------------------------------


def early_run(items, limit=None, pieces=None) -> tuple[EarlyTasks, list[Task]]:
    started: list[Task] = []
    early = EarlyTasks(started.append, limit)
    text = json.dumps(items)[:-1] + ", "  # the plan is still being written
    for i in range(0, len(text), pieces or len(text)):
        early.feed(text[i:i + (pieces or len(text))])
    return early, started


def test_final_tasks_start_at_once_with_dependencies_from_their_references():
    early, started = early_run([draw(0), caption(1, 0), {"task": "object-detection", "id": 2, "dep": [0, 1],
                                                         "args": {"image": "/a.png"}}], pieces=4)
    assert [(t.id, t.task, t.dep, t.args) for t in started] == [
        (0, "text-to-image", [-1], {"text": "a fox"}),
        (1, "image-to-text", [0], {"image": "<GENERATED>-0"}),
        (2, "object-detection", [-1], {"image": "/a.png"}),
    ]
    assert sorted(early.started) == [0, 1, 2] and early.started[1] is started[1]
    assert not early.stopped


@pytest.mark.parametrize("doubtful", [
    {"task": "mind-reading", "id": 1, "args": {"text": "x"}},  # unknown type
    {"task": "tts", "id": 1, "args": {"text": "x"}},  # an alias: the full plan reads it
    {"task": "summarization", "id": 1, "args": {"text": "x"}},  # a lone text task may be chat
    {"task": "translation", "id": 1, "args": {"text": "x"}},
    {"task": "text-to-image", "id": "1", "args": {"text": "x"}},  # id is not a number
    {"task": "text-to-image", "id": 1.0, "args": {"text": "x"}},
    {"task": "text-to-image", "args": {"text": "x"}},
    {"id": 1, "args": {"text": "x"}},  # no type at all
    {"task": "text-to-image", "id": -1, "args": {"text": "x"}},
    {"task": "text-to-image", "id": 0, "args": {"text": "again"}},  # a duplicate id
    {"task": "text-to-image", "id": True, "args": {"text": "x"}},  # renumbered by the full plan
    {"task": "text-to-image", "id": 1, "args": {"text": "x", "style": "oil"}},  # repaired: an argument dropped
    {"task": "image-to-text", "id": 1, "args": {"image": "<GENERATED>-1"}},  # its own output
    {"task": "image-to-text", "id": 1, "args": {"image": "<GENERATED>-5"}},  # a task not read yet
    {"task": "image-to-text", "id": 1, "args": {"image": "<GENERATED>-0, <GENERATED>-0"}},  # split in two
])
def test_anything_doubtful_stops_early_starts_for_the_rest_of_the_plan(doubtful):
    early, started = early_run([draw(0), doubtful, draw(7), draw(8)])
    assert [t.id for t in started] == [0] and early.stopped
    early.feed(json.dumps(draw(9)) + ", ")
    assert [t.id for t in started] == [0]


def test_an_object_that_cannot_be_read_stops_early_starts():
    early, started = early_run([draw(0)])
    early.feed('{: }, ' + json.dumps(draw(2)) + ", ")
    assert [t.id for t in started] == [0] and early.stopped


def test_a_doubtful_first_task_starts_nothing():
    early, started = early_run([{"task": "summarization", "id": 0, "args": {"text": "x"}}, draw(1)])
    assert started == [] and early.started == {} and early.stopped


@pytest.mark.parametrize("limit,expected", [(None, [0, 1, 2, 3]), (2, [0, 1]), (1, [0]), (0, [])])
def test_at_most_limit_tasks_start_early(limit, expected):
    early, started = early_run([draw(0), draw(1), draw(2), draw(3)], limit=limit)
    assert [t.id for t in started] == expected
    assert early.stopped == (limit is not None)


def test_a_plan_written_with_single_quotes_starts_early_too():
    """Python-style quotes are read by the tolerant parser; letters in them (here X) are not brackets."""
    started: list[Task] = []
    early = EarlyTasks(started.append)
    early.feed("[{'task': 'text-to-image', 'id': 0, 'args': {'text': 'a Xmas tree'}}, "
               "{'task': 'image-to-text', 'id': 1, 'args': {'image': '<GENERATED>-0'}}, ")
    assert [(t.id, t.dep, t.args) for t in started] == [(0, [-1], {"text": "a Xmas tree"}),
                                                         (1, [0], {"image": "<GENERATED>-0"})]


def test_a_task_in_the_prose_after_the_plan_never_starts():
    """The full plan is the first array; an example the LLM writes after it must not run."""
    started: list[Task] = []
    early = EarlyTasks(started.append)
    early.feed(json.dumps([draw(0)]) + " You could also ask for: " + json.dumps([draw(1)]))
    assert [t.id for t in started] == [0]


def test_a_task_referring_to_a_task_already_started_waits_for_it():
    early, started = early_run([draw(3), {"task": "image-to-text", "id": 0, "dep": [-1],
                                          "args": {"image": "<GENERATED>-3", "text": "<GENERATED>-3"}}])
    assert [(t.id, t.dep) for t in started] == [(3, [-1]), (0, [3])]


def test_the_full_plan_agrees_only_with_the_same_task_under_the_same_id():
    early, _ = early_run([draw(0), caption(1, 0)])
    assert early.agrees(Task(1, "image-to-text", [0], {"image": "<GENERATED>-0"}))
    assert early.agrees(Task(0, "text-to-image", [-1], {"text": "a fox"}))
    assert not early.agrees(Task(1, "image-to-text", [0], {"image": "/other.png"}))
    assert not early.agrees(Task(1, "image-to-text", [-1], {"image": "<GENERATED>-0"}))
    assert not early.agrees(Task(0, "text-to-video", [-1], {"text": "a fox"}))
    assert not early.agrees(Task(2, "text-to-image", [-1], {"text": "a fox"}))  # never started


def test_the_order_of_arguments_does_not_matter_for_agreement():
    early, _ = early_run([{"task": "visual-question-answering", "id": 0, "args": {"image": "/a.png", "text": "what?"}}])
    assert early.agrees(Task(0, "visual-question-answering", [-1], {"text": "what?", "image": "/a.png"}))
