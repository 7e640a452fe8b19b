"""Edge cases of hugginggpt/plan.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from hugginggpt.plan import (
    TASK_TYPES,
    Plan,
    PlanParseError,
    Task,
    extract_json,
    normalize_task_type,
    parse_plan,
    plan_json_schema,
    tasks_from_json,
)


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


def t(tid, task="text-to-image", dep=None, **args):
    """A task object as an LLM writes it."""
    item = {"task": task, "id": tid, "args": args or {"text": "a cat"}}
    if dep is not None:
        item["dep"] = dep
    return item


def graph(plan: Plan) -> list[tuple[int, str, list[int], dict, str | None]]:
    return [(x.id, x.task, x.dep, x.args, x.error) for x in plan.tasks]


# -- Task and Plan ---------------------------------------------------------------------------


def test_a_task_lists_the_tasks_its_arguments_refer_to_once_each_in_order():
    task = Task(3, "image-to-text", [-1], {"image": "<GENERATED>-2", "text": "<GENERATED>-0 and <GENERATED>-2 and "
                                                                          "<GENERATED>-11"})
    assert task.refs() == [2, 0, 11]
    assert Task(0, "text-to-image", [-1], {"text": "a cat"}).refs() == []


def test_a_task_as_a_dict_and_its_copy_are_independent():
    task = Task(1, "image-to-text", [0], {"image": "<GENERATED>-0"}, error="boom")
    d = task.to_dict()
    assert d == {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}
    d["dep"].append(5)
    d["args"]["text"] = "x"
    assert task.dep == [0] and task.args == {"image": "<GENERATED>-0"}
    twin = task.copy()
    assert (twin.id, twin.task, twin.dep, twin.args, twin.error) == (1, "image-to-text", [0], {"image": "<GENERATED>-0"},
                                                                    "boom")
    twin.dep.append(7)
    twin.args["image"] = "/x.png"
    assert task.dep == [0] and task.args == {"image": "<GENERATED>-0"}


def test_a_plan_lists_its_tasks_and_finds_them_by_id():
    a, b = Task(4, "text-to-image", [-1], {"text": "cat"}), Task(2, "image-to-text", [4], {"image": "<GENERATED>-4"})
    plan = Plan([a, b])
    assert plan.notes == []
    assert plan.to_list() == [a.to_dict(), b.to_dict()]
    assert plan.by_id() == {4: a, 2: b}
    assert Plan([]).notes is not Plan([]).notes


# -- the JSON schema -------------------------------------------------------------------------


def test_the_schema_accepts_a_plan_in_our_vocabulary_and_refuses_anything_else():
    schema = plan_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    good = {"tasks": [{"task": "image-to-text", "id": 0, "dep": [-1],
                       "args": {"text": None, "image": "/e/a.jpg", "audio": None}},
                      {"task": "openpose-control", "id": 1, "dep": [0],
                       "args": {"text": "x", "image": "<GENERATED>-0", "audio": None}}]}
    jsonschema.validate(good, schema)
    jsonschema.validate({"tasks": []}, schema)
    task = good["tasks"][0]
    bad = [
        {},
        {"tasks": "all of them"},
        {"tasks": [], "extra": 1},
        {"tasks": [{**task, "task": "mind-reading"}]},
        {"tasks": [{**task, "id": "0"}]},
        {"tasks": [{**task, "dep": [0.5]}]},
        {"tasks": [{**task, "dep": -1}]},
        {"tasks": [{**task, "args": {"image": "/e/a.jpg"}}]},  # every argument is required (null when absent)
        {"tasks": [{**task, "args": {**task["args"], "style": "oil"}}]},
        {"tasks": [{**task, "args": {**task["args"], "text": 5}}]},
        {"tasks": [{**task, "args": "a cat"}]},
        {"tasks": [{**task, "note": "x"}]},
        {"tasks": ["x"]},
    ] + [{"tasks": [{k: v for k, v in task.items() if k != key}]} for key in ("task", "id", "dep", "args")]
    for plan in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(plan, schema)


def test_the_local_schema_asks_each_task_for_exactly_the_arguments_it_takes():
    schema = plan_json_schema(strict=False, max_tasks=2)
    jsonschema.Draft202012Validator.check_schema(schema)
    branches = [b["properties"]["task"]["enum"] for b in schema["properties"]["tasks"]["items"]["anyOf"]]
    assert sorted(n for names in branches for n in names) == sorted(TASK_TYPES)  # each task in one branch
    good = {"tasks": [{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "a.jpg"}},
                      {"task": "visual-question-answering", "id": 1, "dep": [-1],
                       "args": {"image": "a.jpg", "text": "how many cats?"}}]}
    jsonschema.validate(good, schema)
    jsonschema.validate({"tasks": [{"task": "canny-text-to-image", "id": 0, "dep": [-1],
                                    "args": {"text": "a house", "image": "<GENERATED>-1"}}]}, schema)
    takes = {n: b["properties"]["args"]["required"] for b in schema["properties"]["tasks"]["items"]["anyOf"]
             for n in b["properties"]["task"]["enum"]}
    assert takes["document-question-answering"] == ["image", "text"] and takes["text-to-speech"] == ["text"]
    assert takes["audio-to-audio"] == ["audio"] and takes["tabular-classification"] == ["image"]
    caption, question = good["tasks"]
    bad = [
        {"tasks": [{**caption, "args": {"text": "a.jpg"}}]},  # a caption of text: the wrong kind
        {"tasks": [{**caption, "args": {"image": "a.jpg", "text": "x"}}]},  # an argument it does not take
        {"tasks": [{**question, "args": {"image": "a.jpg"}}]},  # a question without its question
        {"tasks": [{"task": "automatic-speech-recognition", "id": 0, "dep": [-1], "args": {"image": "a.jpg"}}]},
        {"tasks": [{**caption, "args": {"image": None}}]},  # never null
        {"tasks": [caption, question, {**caption, "id": 2}]},  # past max_tasks
        {"tasks": [{**caption, "task": "mind-reading"}]},
    ]
    for plan in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(plan, schema)


def test_the_schema_follows_strict_structured_output_rules():
    """OpenAI's strict mode: object root, every property required, no additional properties anywhere."""
    schema = plan_json_schema()

    def objects(node):
        if isinstance(node, dict):
            if node.get("type") == "object":
                yield node
            for value in node.values():
                yield from objects(value)
        elif isinstance(node, list):
            for value in node:
                yield from objects(value)

    found = list(objects(schema))
    assert schema["type"] == "object" and len(found) == 3
    properties = [p for node in found for p in node["properties"].values()]
    assert all("type" in p for p in properties)  # every value's type is declared, as strict mode requires
    for node in found:
        assert node["additionalProperties"] is False
        assert sorted(node["required"]) == sorted(node["properties"])
    assert "canny-text-to-image" in schema["properties"]["tasks"]["items"]["properties"]["task"]["enum"]


# -- text -> JSON ----------------------------------------------------------------------------


PLAN = [{"task": "text-to-image", "id": 0, "args": {"text": "cat"}}]


@pytest.mark.parametrize("fence", ["```json\n", "```JSON\n", "```js\n", "```javascript\n", "```\n", "```json "])
def test_a_fenced_plan_is_read_from_inside_its_fence(fence):
    text = "I'll draw it [as asked]. Plan:\n" + fence + json.dumps(PLAN) + "\n```\nThat's all {folks}."
    assert extract_json(text) == PLAN


def test_a_fence_without_json_is_passed_over():
    text = "```\nno json here\n```\n" + json.dumps(PLAN)
    assert extract_json(text) == PLAN
    assert extract_json("```\nXYZ\n```\n[1]") == [1]
    assert extract_json("```python\nprint(1)\n``` then [1, 2]") == [1, 2]


def test_a_plan_right_after_the_fence_tag_is_read_from_the_fence():
    assert extract_json("Plan [v2]: ```json[1, 2]```") == [1, 2]
    assert extract_json("Plan [v2]: ```JS{\"a\": 1}```") == {"a": 1}


def test_text_around_the_plan_and_brackets_after_it_are_ignored():
    assert extract_json('Here: [{"a": 1}, [2, 3]] and [4] then ]') == [{"a": 1}, [2, 3]]
    assert extract_json('x [1]]') == [1]
    assert extract_json('[{"a": "x\\"]}"}, 2] tail]') == [{"a": 'x"]}'}, 2]
    assert extract_json("[{'a': 'x]}'}, 3] tail]") == [{"a": "x]}"}, 3]
    assert extract_json('[{"a": "back\\\\"}, 4] ]') == [{"a": "back\\"}, 4]


def test_an_apostrophe_between_letters_is_not_a_quote():
    assert extract_json("[it's, 'b']] ]") == ["it's", "b"]
    assert extract_json("[it's] [2]") == ["it's"]
    assert extract_json("[it's, 'b'] [3]") == ["it's", "b"]
    assert extract_json("[b's, 'x]', 1] [2]") == ["b's", "x]", 1]
    assert extract_json("[it's") == ["it's"]


def test_a_possessive_apostrophe_in_an_unquoted_value_does_not_swallow_the_prose_after_the_plan():
    reply = "[{task: text-to-image, id: 0, dep: [-1], args: {text: the dogs' bowl}}] That's the plan: [1, 2]"
    assert extract_json(reply) == [{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "the dogs' bowl"}}]
    assert extract_json("[dogs', 1] and [2]") == ["dogs'", 1]


def test_an_escaped_quote_does_not_end_a_string():
    assert extract_json('["a\\"]", 1] ["b"]') == ['a"]', 1]


def test_bare_words_in_the_list_are_read_and_text_after_it_ignored():
    assert extract_json("[X, 1] [2]") == ["X", 1]


def test_an_apostrophe_at_the_very_end_is_read_without_error():
    assert extract_json("[1, ab'")[0] == 1


def test_an_apostrophe_after_a_bracket_or_at_the_end_opens_a_quote():
    assert extract_json("['x]', 'y']") == ["x]", "y"]
    assert extract_json("[1, 'a]") == [1, "a]"]


def test_brackets_the_planner_forgot_are_closed():
    assert extract_json('[1, [2, {"a": 3}') == [1, [2, {"a": 3}]]
    assert extract_json('["abc') == ["abc"]
    assert extract_json('[{"text": "it is') == [{"text": "it is"}]


def test_generated_markers_are_normalised_before_reading():
    assert extract_json('[{"text": "<GENERATED-1>", "b": "< generated >- 2 >"}]') == [
        {"text": "<GENERATED>-1", "b": "<GENERATED>-2"}]


def test_the_text_after_a_reference_keeps_its_space():
    plan = parse_plan('[{"task": "image-to-text", "id": 0, "args": {"image": "/a.png"}}, {"task": "translation", "id": 1, '
                      '"args": {"text": "<GENERATED>-0 in French, <generated-0 > and < GENERATED>- 0> too"}}]')
    assert plan.tasks[1].args["text"] == "<GENERATED>-0 in French, <GENERATED>-0 and <GENERATED>-0 too"


@pytest.mark.parametrize("value", [None, 42, ["[1]"], b"[1]"])
def test_a_reply_that_is_not_text_is_refused(value):
    with pytest.raises(PlanParseError, match=exactly("planner output is not text")):
        extract_json(value)


@pytest.mark.parametrize("text", ["no json here", "", "   ", "``` ```", ") ( }"])
def test_a_reply_without_brackets_is_refused(text):
    with pytest.raises(PlanParseError, match=exactly("no JSON in the planner's reply")):
        extract_json(text)


@pytest.mark.parametrize("text", ["[{]", "[[}", "[[[]]}"])
def test_a_list_without_content_is_refused(text):
    with pytest.raises(PlanParseError, match=exactly("not JSON")):
        extract_json(text)


def test_lists_with_some_content_are_read():
    assert extract_json("[[], 1}") == [[], 1]
    assert extract_json("[{}, 1}") == [{}, 1]
    assert extract_json("[{'task': 'x'}}") == [{"task": "x"}]  # repaired: a dict with keys is content
    assert extract_json("[[[1]]}") == [[[1]]]


def test_bare_objects_one_after_another_are_collected():
    assert extract_json('Plan: {"a": 1} and then {"b": 2}\n{"c": 3}') == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json('{"a": 1} {}') == [{"a": 1}, {}]
    assert extract_json('{"a": {"b": 1}} {"c": 2}') == [{"a": {"b": 1}}, {"c": 2}]
    assert extract_json('{"a": 1}{"b": 2}') == [{"a": 1}, {"b": 2}]


def test_an_object_wrapping_the_task_list_is_returned_whole():
    assert extract_json('x{"tasks": [1, 2]} {]') == {"tasks": [1, 2]}
    assert extract_json('{"a": 1} {]') == {"a": 1}


@pytest.mark.parametrize("text", ["{]", "{:}", "{]} {]"])
def test_objects_that_cannot_be_read_are_refused(text):
    with pytest.raises(PlanParseError, match=exactly("no JSON in the planner's reply")):
        extract_json(text)


# -- JSON -> tasks -----------------------------------------------------------------------------


@pytest.mark.parametrize("name,expected", [
    ("text-to-image", "text-to-image"),
    ("  Text_To Image ", "text-to-image"),
    ("IMAGE_CAPTIONING", "image-to-text"),
    ("Speech Recognition", "automatic-speech-recognition"),
    ("canny-control", "canny-control"),
    ("mind-reading", None),
    (None, None),
    (5, None),
    (["text-to-image"], None),
])
def test_task_type_names_are_normalised(name, expected):
    assert normalize_task_type(name) == expected


def test_a_clean_plan_reads_without_notes():
    plan = tasks_from_json([t(0, dep=[-1]), t(1, "image-to-text", dep=[0], image="<GENERATED>-0")])
    assert graph(plan) == [(0, "text-to-image", [-1], {"text": "a cat"}, None),
                           (1, "image-to-text", [0], {"image": "<GENERATED>-0"}, None)]
    assert plan.notes == []


@pytest.mark.parametrize("key", ["tasks", "plan", "task_list"])
def test_an_object_holding_the_task_list_under_a_known_key(key):
    plan = tasks_from_json({"thoughts": "easy", key: [t(0)]})
    assert graph(plan) == [(0, "text-to-image", [-1], {"text": "a cat"}, None)] and plan.notes == []


def test_an_object_with_a_key_that_is_not_a_list_is_one_task():
    plan = tasks_from_json({"tasks": "draw", **t(0)})
    assert [x.task for x in plan.tasks] == ["text-to-image"]
    assert plan.notes == ["the planner returned one object; treated it as a one-task list"]


@pytest.mark.parametrize("data", ["draw a cat", 5, None])
def test_anything_but_a_list_or_object_is_refused(data):
    with pytest.raises(PlanParseError, match=exactly("the plan is not a list of tasks")):
        tasks_from_json(data)


def test_items_that_are_not_objects_are_noted_and_ignored():
    plan = tasks_from_json(["draw", t(5), 3])
    assert [x.id for x in plan.tasks] == [5]
    assert plan.notes == ["item 0: not an object, ignored", "item 2: not an object, ignored"]


def test_missing_negative_duplicate_or_unreadable_ids_are_renumbered_and_noted():
    items = [t(0), t(0), {"task": "text-to-image", "args": {"text": "b"}}, t(-4), t("x"), t(True), t(2.0), t("7")]
    plan = tasks_from_json(items)
    assert [x.id for x in plan.tasks] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert plan.notes == [
        "item 1: id 0 missing or duplicated, renumbered to 1",
        "item 3: id -4 missing or duplicated, renumbered to 3",
        "item 4: id 'x' missing or duplicated, renumbered to 4",
        "item 5: id True missing or duplicated, renumbered to 5",
        "item 6: id 2.0 missing or duplicated, renumbered to 6",
    ]


def test_a_renumbered_task_takes_the_first_free_id_from_its_position():
    plan = tasks_from_json([t(1), t(2), t(1)])
    assert [x.id for x in plan.tasks] == [1, 2, 3]
    assert plan.notes == ["item 2: id 1 missing or duplicated, renumbered to 3"]


def test_an_id_zero_is_kept():
    plan = tasks_from_json([t(3), t(0)])
    assert [x.id for x in plan.tasks] == [3, 0] and plan.notes == []


def test_an_id_written_as_a_generated_marker_or_padded_string_is_read():
    plan = tasks_from_json([t("<GENERATED>-4"), t(" 6 "), t("-1"), t(3.0)])
    assert [x.id for x in plan.tasks] == [4, 6, 2, 3]
    assert plan.notes == ["item 2: id '-1' missing or duplicated, renumbered to 2"]


def test_a_fractional_id_is_renumbered():
    plan = tasks_from_json([t(1.5)])
    assert [x.id for x in plan.tasks] == [0]
    assert plan.notes == ["item 0: id 1.5 missing or duplicated, renumbered to 0"]


def test_an_unknown_task_type_is_kept_as_written_and_reported():
    plan = tasks_from_json([t(0, "mind-reading"), t(1, 42)])
    assert (plan.tasks[0].task, plan.tasks[1].task) == ("mind-reading", "42")
    assert plan.tasks[0].error == ("unknown task type 'mind-reading'; supported types are listed in the planner "
                                   "prompt")
    assert plan.tasks[1].error == "unknown task type 42; supported types are listed in the planner prompt"
    assert plan.notes == [f"task 0: {plan.tasks[0].error}", f"task 1: {plan.tasks[1].error}"]


def test_an_alias_is_read_as_its_task_type_and_noted():
    plan = tasks_from_json([t(0, "TTS", text="hi"), t(1, "Image_To_Text", image="/a.png")])
    assert [(x.task, x.error) for x in plan.tasks] == [("text-to-speech", None), ("image-to-text", None)]
    assert plan.notes == ["task 0: task type 'TTS' read as 'text-to-speech'",
                          "task 1: task type 'Image_To_Text' read as 'image-to-text'"]


def test_arguments_are_renamed_cleaned_and_reduced_to_text():
    plan = tasks_from_json([{"task": "visual-question-answering", "id": 0, "args": {
        " IMG ": "/a.png", "Question": "what?", "audio": None, "image": "/b.png", "query": "ignored"}}])
    assert plan.tasks[0].args == {"image": "/a.png", "text": "what?"}
    assert plan.notes == []


def test_argument_values_that_are_not_strings_become_strings():
    plan = tasks_from_json([
        {"task": "text-to-image", "id": 0, "args": {"text": ["<generated>-1", "b"]}},
        {"task": "text-to-image", "id": 1, "args": {"text": 7, "image": {"url": "/a.png"}, "audio": True}},
    ])
    assert plan.tasks[0].args == {"text": "<GENERATED>-1,b"}
    assert plan.tasks[1].args == {"text": "7", "image": '{"url": "/a.png"}', "audio": "True"}


def test_a_lone_surrogate_in_an_argument_is_replaced():
    plan = tasks_from_json([{"task": "text-to-image", "id": 0, "args": {"text": "a \ud800 cat"}}])
    assert plan.tasks[0].args["text"] == "a \ufffd cat"


def test_arguments_after_a_dropped_or_repeated_one_are_kept():
    plan = tasks_from_json([{"task": "visual-question-answering", "id": 0,
                             "args": {"style": "oil", "image": "/a.png", "img": "/b.png", "text": "what?"}}])
    assert plan.tasks[0].args == {"image": "/a.png", "text": "what?"}


def test_an_argument_given_as_null_is_absent():
    plan = tasks_from_json([{"task": "image-to-text", "id": 0, "args": {"image": None, "img": "/a.png", "text": None}}])
    assert plan.tasks[0].args == {"image": "/a.png"} and plan.notes == []


def test_unknown_arguments_are_dropped_and_noted():
    plan = tasks_from_json([{"task": "text-to-image", "id": 3, "args": {"text": "cat", "Style": "oil", 5: "x"}}])
    assert plan.tasks[0].args == {"text": "cat"}
    assert plan.notes == ["task 3: dropped argument 'Style' (only text, image, audio are allowed)",
                          "task 3: dropped argument 5 (only text, image, audio are allowed)"]


def test_arguments_given_as_a_string_are_the_text_argument():
    plan = tasks_from_json([{"task": "text-to-speech", "id": 2, "args": "hello there"},
                            {"task": "text-to-speech", "id": 3, "args": "   "},
                            {"task": "text-to-speech", "id": 4, "args": ["hello"]},
                            {"task": "text-to-speech", "id": 5}])
    assert [x.args for x in plan.tasks] == [{"text": "hello there"}, {}, {}, {}]
    assert plan.notes == ["task 2: args was a string; used it as the text argument"]


def test_dependencies_come_from_the_references_not_from_dep():
    plan = tasks_from_json([t(0), t(1), t(2, "image-to-text", dep=[0, 1], image="<GENERATED>-1")])
    assert plan.tasks[2].dep == [1]
    plan = tasks_from_json([t(0), t(1, "image-to-text", dep="0", image="/a.png")])
    assert plan.tasks[1].dep == [-1]


@pytest.mark.parametrize("dep", [0, "0", [0], ["0"], [0.0], [-1, 0], [0, -1], ["<GENERATED>-0"], [0, True]])
def test_a_reference_to_a_missing_task_is_repaired_from_the_one_dependency_written(dep):
    plan = tasks_from_json([t(0), t(1, "image-to-text", dep=dep, image="<GENERATED>-9", text="<GENERATED>-9 ok")])
    assert plan.tasks[1].args == {"image": "<GENERATED>-0", "text": "<GENERATED>-0 ok"}
    assert plan.tasks[1].dep == [0] and plan.tasks[1].error is None
    assert plan.notes == ["task 1: reference to missing task 9 read as 0"]


@pytest.mark.parametrize("dep", [None, [], [-1], [1], [5], [0, 2], "x", [None]])
def test_a_reference_to_a_missing_task_is_not_guessed_without_one_clear_dependency(dep):
    plan = tasks_from_json([t(0), t(1, "image-to-text", dep=dep, image="<GENERATED>-9"), t(2)])
    task = plan.tasks[1]
    assert task.args == {"image": "<GENERATED>-9"} and task.dep == [-1]
    assert task.error == "an argument refers to task 9, which is not in the plan"
    assert plan.notes == []


def test_a_task_without_dep_is_not_repaired_from_another_task():
    plan = tasks_from_json([t(0), t(1), t(3, "image-to-text", image="<GENERATED>-9")])
    assert plan.tasks[2].error == "an argument refers to task 9, which is not in the plan"
    assert plan.tasks[2].args == {"image": "<GENERATED>-9"}


def test_a_reference_to_a_task_that_already_ran_does_not_hide_a_missing_one():
    plan = tasks_from_json([t(3, "image-to-text", image="<GENERATED>-1", text="<GENERATED>-9")],
                           finished=frozenset({1}))
    assert plan.tasks[0].error == "an argument refers to task 9, which is not in the plan"


def test_a_reference_to_a_task_that_already_ran_is_kept_without_a_dependency():
    plan = parse_plan('[{"task": "image-to-text", "id": 3, "dep": [1], "args": {"image": "<GENERATED>-1"}}]',
                      finished=frozenset({1}))
    assert graph(plan) == [(3, "image-to-text", [-1], {"image": "<GENERATED>-1"}, None)] and plan.notes == []
    # an id both finished and in the new plan means the new task
    plan = tasks_from_json([t(1), t(3, "image-to-text", image="<GENERATED>-1")], finished=frozenset({1}))
    assert plan.tasks[1].dep == [1]


def test_a_self_reference_is_an_error_that_does_not_hide_an_earlier_one():
    plan = tasks_from_json([t(0, "image-to-image", image="<GENERATED>-0"), t(1, "mind-reading", image="<GENERATED>-1")])
    assert plan.tasks[0].error == "an argument refers to the task's own output" and plan.tasks[0].dep == [-1]
    assert plan.tasks[1].error.startswith("unknown task type")


def test_a_missing_reference_error_does_not_hide_an_earlier_one():
    plan = tasks_from_json([t(0, "image-to-image", image="<GENERATED>-0", text="<GENERATED>-7")])
    assert plan.tasks[0].error == "an argument refers to the task's own output"
    plan = tasks_from_json([t(0, "image-to-image", image="<GENERATED>-7", text="<GENERATED>-0")])
    assert plan.tasks[0].error == "an argument refers to task 7, which is not in the plan"


def test_unfold_makes_one_task_per_reference_with_fresh_ids_and_a_note():
    plan = tasks_from_json([t(0), t(1), t(4), t(2, "image-classification", image="<GENERATED>-0, <GENERATED>-1,<GENERATED>-4",
                                                text="keep")])
    cls = [x for x in plan.tasks if x.task == "image-classification"]
    assert [(x.id, x.dep, x.args) for x in cls] == [(2, [0], {"image": "<GENERATED>-0", "text": "keep"}),
                                                    (5, [1], {"image": "<GENERATED>-1", "text": "keep"}),
                                                    (6, [4], {"image": "<GENERATED>-4", "text": "keep"})]
    assert [x.id for x in plan.tasks] == [0, 1, 4, 2, 5, 6]
    assert plan.notes == ["task 2: unfolded into tasks [2, 5, 6]"]


def test_unfold_splits_only_lists_made_of_references():
    plan = tasks_from_json([t(0), t(1, "image-classification", image="<GENERATED>-0, /b.png"),
                            t(2, "image-classification", image="<GENERATED>-0"),
                            t(3, "text-to-image", text="cats, dogs")])
    assert [x.id for x in plan.tasks] == [0, 1, 2, 3] and plan.notes == []
    assert plan.tasks[1].args == {"image": "<GENERATED>-0, /b.png"}


def test_unfold_splits_the_first_argument_that_lists_references():
    plan = tasks_from_json([t(0), t(1), t(2, "visual-question-answering", text="<GENERATED>-0,<GENERATED>-1",
                                        image="<GENERATED>-0,<GENERATED>-1")])
    vqa = [x.args for x in plan.tasks if x.task == "visual-question-answering"]
    assert vqa == [{"text": "<GENERATED>-0", "image": "<GENERATED>-0,<GENERATED>-1"},
                   {"text": "<GENERATED>-1", "image": "<GENERATED>-0,<GENERATED>-1"}]


def test_unfolded_copies_are_independent():
    plan = tasks_from_json([t(0), t(1), t(2, "image-classification", image="<GENERATED>-0,<GENERATED>-1")])
    first, second = plan.tasks[2], plan.tasks[3]
    first.args["text"] = "changed"
    assert second.args == {"image": "<GENERATED>-1"}


def test_a_cycle_marks_only_the_tasks_on_it():
    plan = tasks_from_json([
        t(5, "image-to-text", image="<GENERATED>-0"),  # leads into the cycle, is not on it
        t(0, "image-to-image", image="<GENERATED>-2"),
        t(1, "image-to-image", image="<GENERATED>-0"),
        t(2, "image-to-image", image="<GENERATED>-1"),
        t(3, "image-to-text", image="<GENERATED>-1"),
        t(4),
    ])
    errors = {x.id: x.error for x in plan.tasks}
    assert errors == {5: None, 0: "dependency cycle through tasks [0, 1, 2]", 1: "dependency cycle through tasks [0, 1, 2]",
                      2: "dependency cycle through tasks [0, 1, 2]", 3: None, 4: None}
    assert plan.notes == ["dependency cycle through tasks [0, 1, 2]; those tasks will not run"]


def test_a_cycle_does_not_hide_an_earlier_error():
    plan = tasks_from_json([t(0, "mind-reading", image="<GENERATED>-1"), t(1, "image-to-image", image="<GENERATED>-0")])
    assert plan.tasks[0].error.startswith("unknown task type")
    assert plan.tasks[1].error == "dependency cycle through tasks [0, 1]"


def test_shared_dependencies_are_no_cycle():
    plan = tasks_from_json([t(0), t(1, "image-to-image", image="<GENERATED>-0"), t(2, "image-to-image", image="<GENERATED>-0"),
                            t(3, "image-to-image", image="<GENERATED>-1", text="<GENERATED>-2")])
    assert all(x.error is None for x in plan.tasks) and plan.notes == []
    assert plan.tasks[3].dep == [1, 2]


def test_a_deep_lattice_of_shared_dependencies_is_checked_quickly():
    """Each layer's two tasks both use both tasks of the layer before: walking every path takes 2**40 steps."""
    items = [t(0), t(1)]
    for n in range(2, 82, 2):
        refs = {"image": f"<GENERATED>-{n - 2}", "text": f"<GENERATED>-{n - 1} too"}
        items += [t(n, "image-to-image", **refs), t(n + 1, "image-to-image", **refs)]
    plan = tasks_from_json(items)
    assert all(x.error is None for x in plan.tasks) and plan.notes == []
    assert plan.tasks[-1].dep == [78, 79]


def test_parse_plan_reads_text_into_a_checked_plan():
    plan = parse_plan('Plan: [{"task": "tts", "id": "0", "args": {"prompt": "hi"}}]')
    assert graph(plan) == [(0, "text-to-speech", [-1], {"text": "hi"}, None)]
    with pytest.raises(PlanParseError):
        parse_plan("no plan")
