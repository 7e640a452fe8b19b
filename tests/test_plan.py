"""Tolerant planning: a corpus of messy plans as real LLMs write them."""

from __future__ import annotations

import pytest

from hugginggpt.plan import PlanParseError, parse_plan

CLEAN = [("image-to-text", 0, [-1]), ("text-to-speech", 1, [0])]

MESSY = {
    "plain": '[{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/e/a.jpg"}}, '
             '{"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}]',
    "prose and fence": 'Sure! Here is the plan:\n```json\n[{"task": "image-to-text", "id": 0, "dep": [-1], '
                       '"args": {"image": "/e/a.jpg"}}, {"task": "text-to-speech", "id": 1, "dep": [0], '
                       '"args": {"text": "<GENERATED>-0"}}]\n```\nLet me know if you need more.',
    "single quotes": "[{'task': 'image-to-text', 'id': 0, 'dep': [-1], 'args': {'image': '/e/a.jpg'}}, "
                     "{'task': 'text-to-speech', 'id': 1, 'dep': [0], 'args': {'text': '<GENERATED>-0'}}]",
    "trailing commas": '[{"task": "image-to-text", "id": 0, "dep": [-1,], "args": {"image": "/e/a.jpg",},}, '
                       '{"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"},},]',
    "generated-0 typo": '[{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/e/a.jpg"}}, '
                        '{"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED-0>"}}]',
    "missing closing bracket": '[{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/e/a.jpg"}}, '
                               '{"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}',
    "string ids and deps": '[{"task": "image-to-text", "id": "0", "dep": "-1", "args": {"image": "/e/a.jpg"}}, '
                           '{"task": "text-to-speech", "id": "1", "dep": ["0"], "args": {"text": "<GENERATED>-0"}}]',
    "no dep at all": '[{"task": "image-to-text", "id": 0, "args": {"image": "/e/a.jpg"}}, '
                     '{"task": "text-to-speech", "id": 1, "args": {"text": "<GENERATED>-0"}}]',
    "wrong dep, refs win": '[{"task": "image-to-text", "id": 0, "dep": [5], "args": {"image": "/e/a.jpg"}}, '
                           '{"task": "text-to-speech", "id": 1, "dep": [-1], "args": {"text": "<GENERATED>-0"}}]',
    "python literals": "[{'task': 'image-to-text', 'id': 0, 'dep': [-1], 'args': {'image': '/e/a.jpg'}, "
                       "'x': None}, {'task': 'text-to-speech', 'id': 1, 'dep': [0], 'args': {'text': '<GENERATED>-0'},"
                       " 'y': true}]",
    "aliases": '[{"task": "image_captioning", "id": 0, "dep": [-1], "args": {"img": "/e/a.jpg"}}, '
               '{"task": "TTS", "id": 1, "dep": [0], "args": {"text": "<generated>-0"}}]',
    "wrapped in an object": '{"tasks": [{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": '
                            '"/e/a.jpg"}}, {"task": "text-to-speech", "id": 1, "dep": [0], "args": '
                            '{"text": "<GENERATED>-0"}}]}',
    "objects without a list": 'Plan:\n{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/e/a.jpg"}}\n'
                              '{"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}',
}


@pytest.mark.parametrize("name", sorted(MESSY))
def test_messy_plans_parse_to_the_same_graph(name):
    plan = parse_plan(MESSY[name])
    assert [(t.task, t.id, t.dep) for t in plan.tasks] == CLEAN, plan.notes
    assert plan.tasks[0].args["image"] == "/e/a.jpg"
    assert plan.tasks[1].args["text"] == "<GENERATED>-0"
    assert all(t.error is None for t in plan.tasks)


def test_lone_object_is_a_one_task_plan():
    plan = parse_plan('{"task": "object-detection", "id": 0, "dep": [-1], "args": {"image": "/e/a.jpg"}}')
    assert [t.task for t in plan.tasks] == ["object-detection"]


@pytest.mark.parametrize("text", ["I cannot help with that.", "", "``` ```", "[{]", "42"])
def test_unparseable_plans_raise(text):
    with pytest.raises(PlanParseError):
        parse_plan(text)


def test_empty_list_is_an_empty_plan():
    assert parse_plan("[]").tasks == []


def test_unknown_task_type_is_reported_not_run():
    plan = parse_plan('[{"task": "mind-reading", "id": 0, "dep": [-1], "args": {"text": "x"}},'
                      '{"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}]')
    assert "unknown task type 'mind-reading'" in plan.tasks[0].error
    assert plan.tasks[1].error is None and plan.tasks[1].dep == [0]


def test_args_outside_text_image_audio_are_dropped():
    plan = parse_plan('[{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "cat", "style": "oil"}}]')
    assert plan.tasks[0].args == {"text": "cat"}
    assert any("style" in n for n in plan.notes)


def test_reference_to_missing_task_is_repaired_from_dep_when_clear():
    plan = parse_plan('[{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "cat"}},'
                      '{"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-7"}}]')
    assert plan.tasks[1].args["image"] == "<GENERATED>-0" and plan.tasks[1].dep == [0]


def test_reference_to_missing_task_is_reported_when_unclear():
    plan = parse_plan('[{"task": "image-to-text", "id": 1, "dep": [-1], "args": {"image": "<GENERATED>-7"}}]')
    assert "task 7, which is not in the plan" in plan.tasks[0].error


def test_a_missing_reference_is_not_guessed_when_several_earlier_tasks_could_have_made_it():
    plan = parse_plan('[{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "cat"}},'
                      '{"task": "text-to-image", "id": 1, "dep": [-1], "args": {"text": "dog"}},'
                      '{"task": "image-to-text", "id": 2, "dep": [0, 1], "args": {"image": "<GENERATED>-7"}}]')
    task = plan.tasks[2]
    assert task.args["image"] == "<GENERATED>-7" and "task 7, which is not in the plan" in task.error
    assert not any("read as" in n for n in plan.notes)
    # a dep on a task that is not in the plan either is no clue
    plan = parse_plan('[{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "cat"}},'
                      '{"task": "image-to-text", "id": 1, "dep": [0, 9], "args": {"image": "<GENERATED>-7"}}]')
    assert plan.tasks[1].args["image"] == "<GENERATED>-0" and plan.tasks[1].error is None


def test_forward_reference_without_cycle_is_kept():
    plan = parse_plan('[{"task": "image-to-text", "id": 0, "dep": [1], "args": {"image": "<GENERATED>-1"}},'
                      '{"task": "text-to-image", "id": 1, "dep": [-1], "args": {"text": "cat"}}]')
    assert plan.tasks[0].dep == [1] and plan.tasks[0].error is None


def test_cycles_are_reported():
    plan = parse_plan('[{"task": "image-to-text", "id": 0, "dep": [1], "args": {"image": "<GENERATED>-1"}},'
                      '{"task": "image-to-image", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},'
                      '{"task": "text-to-image", "id": 2, "dep": [-1], "args": {"text": "ok"}}]')
    assert "cycle" in plan.tasks[0].error and "cycle" in plan.tasks[1].error
    assert plan.tasks[2].error is None


def test_self_reference_is_reported():
    plan = parse_plan('[{"task": "image-to-image", "id": 0, "dep": [0], "args": {"image": "<GENERATED>-0"}}]')
    assert "own output" in plan.tasks[0].error


def test_unfold_gives_one_task_per_generated_ref_with_fresh_ids():
    plan = parse_plan('[{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "cat"}},'
                      '{"task": "text-to-image", "id": 1, "dep": [-1], "args": {"text": "dog"}},'
                      '{"task": "image-classification", "id": 2, "dep": [0, 1], '
                      '"args": {"image": "<GENERATED>-0,<GENERATED>-1"}}]')
    cls = [t for t in plan.tasks if t.task == "image-classification"]
    assert [(t.id, t.dep, t.args["image"]) for t in cls] == [(2, [0], "<GENERATED>-0"), (3, [1], "<GENERATED>-1")]


def test_duplicate_ids_are_renumbered():
    plan = parse_plan('[{"task": "text-to-image", "id": 0, "args": {"text": "a"}},'
                      '{"task": "text-to-image", "id": 0, "args": {"text": "b"}}]')
    assert sorted(t.id for t in plan.tasks) == [0, 1]


def test_a_task_copy_is_independent_of_the_planned_task():
    """A task's arguments are resolved (`<GENERATED>-N` replaced) in a copy: the plan keeps its references."""
    from hugginggpt.plan import Task

    planned = Task(id=1, task="image-to-text", dep=[0], args={"image": "<GENERATED>-0"})
    running = planned.copy()
    running.args["image"] = "/images/drawn.png"
    running.dep.append(2)
    assert planned.args == {"image": "<GENERATED>-0"} and planned.dep == [0]
    assert running.to_dict() == {"task": "image-to-text", "id": 1, "dep": [0, 2], "args": {"image": "/images/drawn.png"}}
