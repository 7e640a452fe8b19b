"""Plan scoring on TaskBench (hugginggpt/evaluation.py) pinned on small hand-built cases, in-process.

tests/test_taskbench.py runs the whole harness, but only where the TaskBench sample sits beside the checkout
(../shared/taskbench), which CI lacks: there, nothing else would notice a broken metric. Here every score is
worked out by hand (the arithmetic is in the comments), on tool mappings and JSONL records written into
tmp_path: the mapping file's reading, the names both ways, our plan -> TaskBench nodes and back, the argument
kinds, the node and edge items, the pooled (micro) F1 over samples, unreadable and missing plans, the
valid-plan rate, and the table and JSON summary `bench/taskbench.py` prints from them (mutation audit:
docs/TESTING.md).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import pytest

from hugginggpt.evaluation import (
    Scores,
    Tally,
    ToolSet,
    edges_from_args,
    gold_as_our_plan,
    node_names,
    score,
    to_taskbench,
)
from hugginggpt.plan import Plan, Task, parse_plan
from tests.conftest import ROOT

# A tool_mapping.json as the harness reads it: six TaskBench tools, one with no counterpart of ours
# (Image Editing) and one whose type of ours is not its slug (Speech-to-Text).
MAPPING = {
    "taskbench_to_hugginggpt": {
        "Text-to-Image": "text-to-image",
        "Image Editing": None,
        "Speech-to-Text": "automatic-speech-recognition",
        "Text-to-Speech": "text-to-speech",
        "Text-to-Video": "text-to-video",
        "Summarization": "summarization",
    },
    "taskbench_io_types": {
        "Text-to-Image": {"input-type": ["text"], "output-type": ["image"]},
        "Image Editing": {"input-type": ["image", "text"], "output-type": ["image"]},
        "Speech-to-Text": {"input-type": ["audio"], "output-type": ["text"]},
        "Text-to-Speech": {"input-type": ["text"], "output-type": ["audio"]},
        "Text-to-Video": {"input-type": ["text"], "output-type": ["video"]},
        "Summarization": {"input-type": ["text"]},  # no output-type: reads as no outputs
    },
}
TOOLS = ToolSet(dict(MAPPING["taskbench_to_hugginggpt"]),
                {k: list(v.get("output-type", [])) for k, v in MAPPING["taskbench_io_types"].items()})


def node(task: str | None, *arguments) -> dict:
    """A TaskBench task node; task None leaves the key out."""
    out: dict = {"arguments": list(arguments)}
    if task is not None:
        out["task"] = task
    return out


def gold_row(sid: str, nodes: list[str], links: list[list[str]]) -> dict:
    """A row of huggingface_sample_gold.jsonl (links as JSON gives them: lists, not tuples)."""
    return {"id": sid, "gold_nodes": nodes, "gold_links_from_args": links}


def tally(t: Tally) -> tuple[int, int, int]:
    return t.tp, t.fp, t.fn


# -- the mapping file and the names both ways ----------------------------------------------------


def test_the_mapping_file_gives_the_tool_names_our_types_and_each_tools_outputs(tmp_path):
    path = tmp_path / "tool_mapping.json"
    path.write_text(json.dumps(MAPPING))
    tools = ToolSet.load(str(path))  # a str path is taken too
    assert tools.to_ours == MAPPING["taskbench_to_hugginggpt"]
    assert tools.outputs == {"Text-to-Image": ["image"], "Image Editing": ["image"], "Speech-to-Text": ["text"],
                             "Text-to-Speech": ["audio"], "Text-to-Video": ["video"], "Summarization": []}
    assert tools.names == {"Text-to-Image", "Image Editing", "Speech-to-Text", "Text-to-Speech", "Text-to-Video",
                           "Summarization"}
    assert ToolSet.load(path) == tools


def test_ours_is_the_mapped_type_else_a_lowercase_hyphen_slug_of_the_name():
    assert TOOLS.ours("Speech-to-Text") == "automatic-speech-recognition"  # mapped (its slug would differ)
    assert TOOLS.ours("Text-to-Image") == "text-to-image"
    assert TOOLS.ours("Image Editing") == "image-editing"  # mapped to None: the slug
    assert TOOLS.ours("  Style_Transfer Plus ") == "style-transfer-plus"  # unknown: stripped, "_" and " " -> "-"


def test_theirs_maps_back_by_the_mapping_then_by_the_slug_then_leaves_the_type_as_it_is():
    assert TOOLS.theirs("automatic-speech-recognition") == "Speech-to-Text"
    assert TOOLS.theirs("text-to-video") == "Text-to-Video"
    assert TOOLS.theirs("image-editing") == "Image Editing"  # no counterpart: found by its slug
    assert TOOLS.theirs("visual-question-answering") == "visual-question-answering"  # not a TaskBench tool
    assert TOOLS.theirs("speech-to-text") == "speech-to-text"  # a mapped name's slug is not the way back
    # two TaskBench names for one type of ours: the mapping's last one is the way back
    twice = ToolSet({"Text-to-Image": "text-to-image", "Image Generation": "text-to-image"}, {})
    assert twice.theirs("text-to-image") == "Image Generation"


# -- our plan -> TaskBench nodes -----------------------------------------------------------------


def test_a_plan_that_could_not_be_read_or_has_no_tasks_is_an_empty_node_list():
    assert to_taskbench(None, TOOLS) == []
    assert to_taskbench(Plan([]), TOOLS) == []


def test_our_plan_becomes_taskbench_nodes_with_references_renumbered_by_position():
    plan = Plan([
        Task(5, "automatic-speech-recognition", [-1], {"audio": "/in/a.wav"}),
        Task(2, "image-editing", [5], {"text": "<GENERATED>-5", "image": "/in/b.png"}),
        Task(7, "visual-question-answering", [2, 9], {"text": "from <GENERATED>-2 and <GENERATED>-9"}),
    ])
    assert to_taskbench(plan, TOOLS) == [
        {"task": "Speech-to-Text", "arguments": ["/in/a.wav"]},
        {"task": "Image Editing", "arguments": ["<node-0>", "/in/b.png"]},  # task 5 is at position 0
        # task 2 is at position 1; task 9 is in no position of the plan
        {"task": "visual-question-answering", "arguments": ["from <node-1> and <missing>"]},
    ]


# -- a TaskBench gold plan -> our plan (for replays) ---------------------------------------------


def test_a_gold_chain_becomes_our_plan_with_ids_deps_and_argument_kinds():
    gold = [
        node("Text-to-Image", "a red fox"),
        node("Image Editing", "<node-0>", "make it blue"),
        node("Speech-to-Text", "/in/Clip.WAV "),
        node("Summarization", "<node-2>", "and <node-1>"),
        node("Text-to-Speech", "<node-3>", "slowly"),
    ]
    assert gold_as_our_plan(gold, TOOLS) == [
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a red fox"}},
        # node 0 (Text-to-Image) outputs an image: the reference is an image argument
        {"task": "image-editing", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0", "text": "make it blue"}},
        # a file's kind by its suffix, case and spaces aside; the value itself kept as written
        {"task": "automatic-speech-recognition", "id": 2, "dep": [-1], "args": {"audio": "/in/Clip.WAV "}},
        # deps in order of first reference, over all arguments; Speech-to-Text outputs text
        {"task": "summarization", "id": 3, "dep": [2, 1], "args": {"text": "<GENERATED>-2",
                                                                   "image": "and <GENERATED>-1"}},
        # two arguments of one kind are joined with one space; Summarization declares no output: text
        {"task": "text-to-speech", "id": 4, "dep": [3], "args": {"text": "<GENERATED>-3 slowly"}},
    ]


def test_gold_nodes_with_odd_names_structured_arguments_or_nothing_at_all():
    gold = [
        node("Text-to-Image", "a fox"),
        node("Fancy_Tool", {"image": "<node-0>"}, ["x", 1]),  # not a TaskBench tool: its name kept as written
        {},
    ]
    assert gold_as_our_plan(gold, TOOLS) == [
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
        # non-string arguments are read as their JSON text
        {"task": "Fancy_Tool", "id": 1, "dep": [0], "args": {"image": '{"image": "<GENERATED>-0"}',
                                                           "text": '["x", 1]'}},
        {"task": "", "id": 2, "dep": [-1], "args": {}},
    ]


def test_a_self_reference_is_no_dependency_but_still_gives_the_kind():
    gold = [node("Text-to-Image", "<node-0>")]
    assert gold_as_our_plan(gold, TOOLS) == [
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"image": "<GENERATED>-0"}}]


def test_only_the_first_reference_of_an_argument_decides_its_kind():
    gold = [node("Text-to-Image", "a fox"), node("Text-to-Speech", "hello"),
            node("Summarization", "<node-1> over <node-0>")]
    assert gold_as_our_plan(gold, TOOLS)[2] == {
        "task": "summarization", "id": 2, "dep": [1, 0], "args": {"audio": "<GENERATED>-1 over <GENERATED>-0"}}


def test_a_node_named_twice_in_one_argument_or_in_two_is_one_dependency():
    gold = [node("Text-to-Image", "a fox"), node("Image-to-Text", "<node-0> and <node-0>")]
    assert gold_as_our_plan(gold, TOOLS)[1]["dep"] == [0]
    gold = [node("Text-to-Image", "a fox"), node("Visual Question Answering", "<node-0>", "what is in <node-0>?")]
    assert gold_as_our_plan(gold, TOOLS)[1]["dep"] == [0]


def test_a_reference_past_the_last_node_gives_the_kind_by_the_files_suffix():
    # <node-1> in a one-node plan (1 == len(nodes)): no node to ask, so ".mp3" decides
    assert gold_as_our_plan([node("Summarization", "<node-1> /x.mp3")], TOOLS)[0]["args"] == {
        "audio": "<GENERATED>-1 /x.mp3"}
    assert gold_as_our_plan([node("Summarization", "<node-1>")], TOOLS)[0]["args"] == {"text": "<GENERATED>-1"}


@pytest.mark.parametrize(("outputs", "kind"), [
    (["image"], "image"), (["audio"], "audio"), (["video"], "image"),  # we have no video argument
    (["text"], "text"), ([], "text"),
    (["text", "audio", "image"], "image"),  # image before audio
    (["video", "audio"], "audio"),  # audio before video
])
def test_a_referenced_nodes_output_type_gives_the_arguments_kind(outputs, kind):
    tools = ToolSet({"Maker": None}, {"Maker": outputs})
    gold = [node("Maker", "x"), node("User", "<node-0>")]
    assert gold_as_our_plan(gold, tools)[1]["args"] == {kind: "<GENERATED>-0"}


def test_a_reference_to_a_tool_with_no_declared_types_is_text():
    gold = [node("Unlisted Tool", "x.png"), node("User", "<node-0>")]
    assert gold_as_our_plan(gold, TOOLS)[1]["args"] == {"text": "<GENERATED>-0"}


@pytest.mark.parametrize(("value", "kind"), [
    ("/a.jpg", "image"), ("/a.jpeg", "image"), ("/a.png", "image"), ("/a.gif", "image"), ("/a.webp", "image"),
    ("/a.bmp", "image"), ("/a.wav", "audio"), ("/a.mp3", "audio"), ("/a.flac", "audio"), ("/a.ogg", "audio"),
    ("/a.m4a", "audio"), ("/a.mp4", "image"), ("/a.avi", "image"), ("/a.mov", "image"),  # video: image
    ("  /A/PHOTO.PNG\n", "image"),  # case and surrounding space aside
    ("photo.png please", "text"),  # only the end counts
    ("/a/png", "text"), ("a red fox", "text"), ("", "text"),
])
def test_an_unreferenced_arguments_kind_is_its_files_suffix(value, kind):
    assert gold_as_our_plan([node("Summarization", value)], TOOLS)[0]["args"] == {kind: value}


# -- node and edge items -------------------------------------------------------------------------


def test_node_names_are_a_set_with_underscores_read_as_spaces():
    assert node_names([node("Text_to_Image"), node("Text to Image"), node("Summarization"), {}]) == {
        "Text to Image", "Summarization", ""}
    assert node_names([]) == set()


def test_edges_come_from_references_in_arguments_source_to_target():
    nodes = [
        {"task": "Text_to_Image"},  # no arguments at all
        node("Image_Editing", "<node-0> and <node-1>"),  # the self reference is no edge
        node("Summarization", {"text": "<node-1>"}, "<node-4> <node-0>", "<node-0>"),  # <node-4>: past the end
        node(None, "<node-2>"),
    ]
    # The source's "_" is read as a space, the target's is not (as TaskBench's task_eval.py builds links);
    # every reference in an argument counts; a repeated edge is one item.
    assert edges_from_args(nodes) == {("Text to Image", "Image_Editing"), ("Image Editing", "Summarization"),
                                      ("Text to Image", "Summarization"), ("Summarization", "")}


def test_an_edge_from_a_node_without_a_task_has_an_empty_source():
    assert edges_from_args([node(None, "x"), node("B", "<node-0>")]) == {("", "B")}
    assert edges_from_args([]) == set()


def test_reordering_nodes_without_renumbering_their_references_changes_the_edges():
    ordered = [node("Text-to-Image", "a fox"), node("Image Editing", "<node-0>")]
    assert edges_from_args(ordered) == {("Text-to-Image", "Image Editing")}
    assert edges_from_args(ordered[::-1]) == set()  # <node-0> is now Image Editing itself: no edge
    renumbered = [node("Image Editing", "<node-1>"), node("Text-to-Image", "a fox")]
    assert edges_from_args(renumbered) == {("Text-to-Image", "Image Editing")}


# -- the tally and its F1 ------------------------------------------------------------------------


def test_a_tally_counts_true_and_false_positives_and_misses_across_calls():
    t = Tally()
    t.add({"A", "B", "C"}, {"B", "C", "D"})  # tp B,C; fp D; fn A
    assert tally(t) == (2, 1, 1)
    t.add({"E", "F"}, {"G"})  # tp -; fp G; fn E,F
    assert tally(t) == (2, 2, 3)
    assert t.f1 == pytest.approx(4 / 9)  # 2*2 / (2*2 + 2 + 3)


def test_f1_is_two_tp_over_two_tp_plus_fp_plus_fn():
    assert Tally(3, 1, 2).f1 == pytest.approx(6 / 9)  # 2*3 / (2*3 + 1 + 2)
    assert Tally(1, 0, 0).f1 == 1.0
    assert Tally(0, 2, 0).f1 == 0.0
    assert Tally(0, 0, 3).f1 == 0.0
    assert Tally(5, 0, 0).f1 == 1.0


def test_nothing_to_find_and_nothing_found_is_a_perfect_score():
    assert Tally().f1 == 1.0
    assert Scores().valid_rate == 0.0  # no samples: no plan was valid
    assert (tally(Scores().nodes), tally(Scores().edges), Scores().samples, Scores().valid) == (
        (0, 0, 0), (0, 0, 0), 0, 0)


def test_the_valid_rate_is_valid_plans_over_samples():
    assert Scores(samples=4, valid=3).valid_rate == 0.75
    assert Scores(samples=3, valid=0).valid_rate == 0.0


# -- scoring samples -----------------------------------------------------------------------------


def test_the_gold_plan_itself_scores_one_on_nodes_and_edges():
    gold = [gold_row("1", ["Text-to-Image", "Image Editing"], [["Text-to-Image", "Image Editing"]])]
    predicted = {"1": [node("Text-to-Image", "a fox"), node("Image Editing", "<node-0>", "blue")]}
    scores = score(gold, predicted, {"1": True}, TOOLS)
    assert (tally(scores.nodes), tally(scores.edges)) == ((2, 0, 0), (1, 0, 0))
    assert (scores.nodes.f1, scores.edges.f1, scores.samples, scores.valid, scores.valid_rate) == (1.0, 1.0, 1, 1, 1.0)


def test_a_partly_right_plan_and_a_missing_one_are_scored_item_by_item():
    gold = [gold_row("a", ["Summarization", "Text-to-Speech", "Text-to-Image"],
                     [["Summarization", "Text-to-Speech"], ["Summarization", "Text-to-Image"]]),
            gold_row("b", ["Speech-to-Text"], [])]
    predicted = {"a": [node("Summarization", "long text"), node("Text-to-Speech", "<node-0>"),
                       node("Text-to-Video", "<node-0>")]}  # "b": no plan at all, scored as an empty one
    scores = score(gold, predicted, {}, TOOLS)
    # nodes: a: tp Summarization, Text-to-Speech; fp Text-to-Video; fn Text-to-Image. b: fn Speech-to-Text
    assert tally(scores.nodes) == (2, 1, 2)
    assert scores.nodes.f1 == pytest.approx(4 / 7)  # 2*2 / (4 + 1 + 2)
    # edges: a: tp Summarization->Text-to-Speech; fp ->Text-to-Video; fn ->Text-to-Image
    assert tally(scores.edges) == (1, 1, 1)
    assert scores.edges.f1 == 0.5  # 2 / (2 + 1 + 1)
    assert (scores.samples, scores.valid, scores.valid_rate) == (2, 0, 0.0)


def test_scores_are_pooled_over_samples_not_averaged_per_sample():
    gold = [gold_row("c", ["Summarization", "Text-to-Speech", "Text-to-Image", "Text-to-Video"], []),
            gold_row("d", ["Text-to-Image"], [])]
    predicted = {"c": [node("Summarization"), node("Text-to-Speech"), node("Text-to-Image"), node("Text-to-Video")],
                 "d": [node("Text-to-Video")]}
    scores = score(gold, predicted, {}, TOOLS)
    # c: tp 4. d: fp Text-to-Video, fn Text-to-Image (the same tools as in c count again: items are per sample)
    assert tally(scores.nodes) == (4, 1, 1)
    assert scores.nodes.f1 == 0.8  # micro: 2*4 / (8 + 1 + 1); a per-sample mean would say (1 + 0) / 2 = 0.5
    assert tally(scores.edges) == (0, 0, 0) and scores.edges.f1 == 1.0  # no edges anywhere: nothing missed


def test_repeated_nodes_in_a_prediction_count_once():
    gold = [gold_row("1", ["Text-to-Image"], [])]
    scores = score(gold, {"1": [node("Text-to-Image", "a"), node("Text-to-Image", "b"), node("Text_to_Image")]},
                   {}, TOOLS)
    assert tally(scores.nodes) == (1, 0, 0)  # "Text_to_Image" reads as "Text to Image": not a known tool


def test_underscored_tool_names_in_a_prediction_match_the_gold_spelling_with_spaces():
    scores = score([gold_row("1", ["Image Editing"], [])], {"1": [node("Image_Editing", "x.png")]}, {}, TOOLS)
    assert tally(scores.nodes) == (1, 0, 0)


def test_off_list_tool_names_are_dropped_from_nodes_on_both_sides_but_not_from_edges():
    gold = [gold_row("1", ["Text-to-Image", "Speech to Text Plus"], [["Speech to Text Plus", "Text-to-Image"]])]
    predicted = {"1": [node("Fancy Tool", "x"), node("Text-to-Image", "<node-0>")]}
    scores = score(gold, predicted, {}, TOOLS)
    assert tally(scores.nodes) == (1, 0, 0)  # only Text-to-Image is one of the tools
    assert tally(scores.edges) == (0, 1, 1)  # Fancy Tool->Text-to-Image vs Speech to Text Plus->Text-to-Image


def test_right_tools_with_a_reversed_dependency_lose_only_the_edge():
    gold = [gold_row("1", ["Text-to-Image", "Image Editing"], [["Text-to-Image", "Image Editing"]])]
    predicted = {"1": [node("Text-to-Image", "<node-1>"), node("Image Editing", "photo.png")]}
    scores = score(gold, predicted, {}, TOOLS)
    assert tally(scores.nodes) == (2, 0, 0) and scores.nodes.f1 == 1.0
    assert tally(scores.edges) == (0, 1, 1) and scores.edges.f1 == 0.0


def test_the_order_of_nodes_does_not_matter_when_references_follow_it():
    gold = [gold_row("1", ["Text-to-Image", "Image Editing"], [["Text-to-Image", "Image Editing"]])]
    predicted = {"1": [node("Image Editing", "<node-1>"), node("Text-to-Image", "a fox")]}
    scores = score(gold, predicted, {}, TOOLS)
    assert (tally(scores.nodes), tally(scores.edges)) == ((2, 0, 0), (1, 0, 0))


def test_an_empty_gold_plan_turns_every_predicted_item_into_a_false_positive():
    gold = [gold_row("1", [], [])]
    scores = score(gold, {"1": [node("Text-to-Image", "a"), node("Image Editing", "<node-0>")]}, {}, TOOLS)
    assert (tally(scores.nodes), tally(scores.edges)) == ((0, 2, 0), (0, 1, 0))
    assert (scores.nodes.f1, scores.edges.f1) == (0.0, 0.0)


def test_an_empty_prediction_misses_every_gold_item():
    gold = [gold_row("1", ["Text-to-Image", "Image Editing"], [["Text-to-Image", "Image Editing"]])]
    scores = score(gold, {"1": to_taskbench(None, TOOLS)}, {"1": False}, TOOLS)  # an unreadable plan
    assert (tally(scores.nodes), tally(scores.edges)) == ((0, 0, 2), (0, 0, 1))
    assert (scores.nodes.f1, scores.edges.f1, scores.samples, scores.valid) == (0.0, 0.0, 1, 0)


def test_no_samples_score_one_with_a_zero_valid_rate():
    scores = score([], {"x": [node("Text-to-Image")]}, {"x": True}, TOOLS)
    assert (scores.samples, scores.valid, scores.nodes.f1, scores.edges.f1, scores.valid_rate) == (0, 0, 1.0, 1.0, 0.0)


def test_valid_plans_are_counted_per_gold_sample_and_predictions_outside_the_gold_are_ignored():
    gold = [gold_row(i, ["Summarization"], []) for i in ("1", "2", "3", "4")]
    predicted = {"1": [node("Summarization")], "extra": [node("Text-to-Image")]}
    valid = {"1": True, "3": 2, "4": False, "extra": True}  # "2" has no entry: not valid; any truthy value counts once
    scores = score(gold, predicted, valid, TOOLS)
    assert (scores.samples, scores.valid, scores.valid_rate) == (4, 2, 0.5)
    assert tally(scores.nodes) == (1, 0, 3)  # "extra" adds no false positive


# -- files in TaskBench's format, end to end -----------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_replayed_gold_plans_from_taskbench_files_score_one_and_an_unreadable_reply_scores_its_loss(tmp_path):
    (tmp_path / "tool_mapping.json").write_text(json.dumps(MAPPING))
    samples = [
        {"id": "s1", "instruction": "draw a fox and make it blue", "type": "chain",
         "task_nodes": [node("Text-to-Image", "a fox"), node("Image Editing", "<node-0>", "make it blue")]},
        {"id": "s2", "instruction": "summarise this and read it aloud", "type": "chain",
         "task_nodes": [node("Summarization", "a long text"), node("Text-to-Speech", "<node-0>")]},
        {"id": "s3", "instruction": "transcribe /in/a.wav", "type": "single",
         "task_nodes": [node("Speech-to-Text", "/in/a.wav")]},
    ]
    gold = [{"id": s["id"], "clean": s["id"] != "s3", "type": s["type"],
             "gold_nodes": [n["task"] for n in s["task_nodes"]],
             "gold_links_from_args": sorted(map(list, edges_from_args(s["task_nodes"])))} for s in samples]
    write_jsonl(tmp_path / "huggingface_sample.jsonl", samples)
    write_jsonl(tmp_path / "huggingface_sample_gold.jsonl", gold)
    # read back as bench/taskbench.py reads them
    tools = ToolSet.load(tmp_path / "tool_mapping.json")
    samples = [json.loads(line) for line in (tmp_path / "huggingface_sample.jsonl").read_text().splitlines() if line]
    gold = [json.loads(line) for line in (tmp_path / "huggingface_sample_gold.jsonl").read_text().splitlines()
            if line]
    assert gold[0]["gold_links_from_args"] == [["Text-to-Image", "Image Editing"]]

    plans = {s["id"]: parse_plan(json.dumps(gold_as_our_plan(s["task_nodes"], tools))) for s in samples}
    predicted = {sid: to_taskbench(plan, tools) for sid, plan in plans.items()}
    assert predicted["s1"] == samples[0]["task_nodes"]  # there and back: TaskBench's nodes again
    valid = {sid: all(t.error is None for t in plan.tasks) for sid, plan in plans.items()}
    assert valid == {"s1": False, "s2": True, "s3": True}  # we cannot run Image Editing
    scores = score(gold, predicted, valid, tools)
    assert (tally(scores.nodes), tally(scores.edges)) == ((5, 0, 0), (2, 0, 0))
    assert (scores.nodes.f1, scores.edges.f1, scores.valid_rate) == (1.0, 1.0, pytest.approx(2 / 3))

    predicted["s2"] = to_taskbench(None, tools)  # s2's reply could not be read
    clean = score([g for g in gold if g["clean"]], predicted, valid | {"s2": False}, tools)
    assert (clean.samples, tally(clean.nodes), tally(clean.edges)) == (2, (2, 0, 2), (1, 0, 1))
    assert clean.nodes.f1 == pytest.approx(4 / 6)  # 2*2 / (4 + 0 + 2)
    assert clean.edges.f1 == pytest.approx(2 / 3)  # 2*1 / (2 + 0 + 1)
    assert clean.valid_rate == 0.0


# -- what the bench prints from the scores -------------------------------------------------------


@functools.cache
def bench():
    spec = importlib.util.spec_from_file_location("bench_taskbench", ROOT / "bench" / "taskbench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_json_summary_holds_the_f1s_the_rates_and_the_raw_counts():
    scores = Scores(Tally(2, 1, 2), Tally(1, 1, 1), Tally(1, 0, 1), Tally(0, 1, 1), samples=3, valid=2, parsed=3)
    assert bench().summary(scores) == {"node_f1": pytest.approx(4 / 7), "edge_f1": 0.5,
                                       "t_f1": pytest.approx(2 / 3), "v_f1": 0.0,
                                       "valid_rate": pytest.approx(2 / 3), "parse_rate": 1.0, "samples": 3,
                                       "nodes": {"tp": 2, "fp": 1, "fn": 2}, "edges": {"tp": 1, "fp": 1, "fn": 1}}


def test_the_printed_table_gives_percent_to_two_places_and_the_rates_to_one():
    summary = bench().summary
    result = {"prompt": "ours", "all": summary(Scores(Tally(2, 1, 2), Tally(1, 1, 1), Tally(1, 0, 1), Tally(0, 1, 1),
                                                      samples=3, valid=2, parsed=3)),
              "clean": summary(Scores(Tally(1, 0, 0), Tally(0, 0, 0), samples=1, valid=1, parsed=1)),
              "latency": {"median_s": 1.234, "p90_s": 4.567}, "llm": {"model": "tiny"}, "structured": "auto",
              "replanned": 2, "demos_picked": 3, "repair": True, "max_tokens": 656}
    assert bench().table(result) == "\n".join([
        "| run | samples | node-F1 | edge-F1 | t-F1 | v-F1 | valid plans |",
        "|---|---|---|---|---|---|---|",
        "| ours, all | 3 | 57.14 | 50.00 | 66.67 | 0.00 | 66.7% |",  # 100*4/7 = 57.142..; 100*2/3 = 66.66..
        "| ours, clean | 1 | 100.00 | 100.00 | 100.00 | 100.00 | 100.0% |",
        "| gpt-4 (published, full domain) | 7546 | 81.54 | 54.70 | 77.31 | 60.86 | - |",
        "| gpt-3.5-turbo (published, full domain) | 7546 | 69.49 | 33.36 | 55.88 | 36.32 | - |",
        "",
        "replies with a task list (parse rate): 100.0% (2 plans replanned once)",
        "plan latency: p50 1.23 s, p90 4.57 s (LLM: tiny; structured output: auto; demos picked: 3; repair: on; "
        "token cap: 656)",
    ])
    result["prompt"] = "JARVIS (/x/config.default.yaml)"
    assert "| JARVIS prompt, clean | 1 |" in bench().table(result)


def test_the_bench_without_the_taskbench_sample_says_where_it_looked_and_exits_2(tmp_path, capsys):
    assert bench().main(["--data", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"error: no TaskBench sample in {tmp_path} (it lives outside the repository, "
                                       "in ../shared/taskbench)\n")
    assert not (tmp_path / "out").exists()


# -- t-F1 and v-F1 (TaskBench's parameter metrics) ------------------------------------------------


def test_parameters_type_a_literal_by_its_suffix_and_a_reference_by_the_tool_that_makes_it():
    from hugginggpt.evaluation import parameters

    nodes = [node("Speech-to-Text", "example.wav"), node("Summarization", "<node-0>"),
             node("Text-to-Image", "<node-1>", "a 'photo.JPG' style"), node("Text-to-Speech", "<node-3>"),
             node("Text-to-Video", "<node-9>"), node("Unknown Tool", "<node-1>"), node("Image Editing", "<node-5>")]
    typed, valued = parameters(nodes, TOOLS.outputs)
    assert "Speech-to-Text-audio" in typed and "Speech-to-Text-audio-example.wav" in valued
    assert "Summarization-text-Speech-to-Text" in valued  # a reference: the output type and the tool's name
    assert "Text-to-Image-none-Summarization" in valued  # a tool with no output type: "none"
    assert "Text-to-Image-text-a 'photo.JPG' style" in valued  # ".JPG" is not ".jpg": TaskBench is case-sensitive
    assert not any(v.startswith("Text-to-Speech") for v in valued)  # a reference to itself is skipped
    assert not any(v.startswith("Text-to-Video") for v in valued)  # past the last node: skipped
    assert "Image Editing-other-Unknown Tool" in valued  # a tool outside the list: "other"


def test_t_and_v_f1_pool_the_items_of_every_sample():
    gold = [gold_row("a", ["Text-to-Speech"], []), gold_row("b", ["Text-to-Image"], [])]
    predicted = {"a": [node("Text-to-Speech", "hello there")], "b": [node("Text-to-Image", "a red fox")]}
    gold_nodes = {"a": [node("Text-to-Speech", "hello there")], "b": [node("Text-to-Image", "a fox")]}
    scores = score(gold, predicted, {"a": True, "b": True}, TOOLS, {"a": True, "b": False}, gold_nodes)
    assert tally(scores.types) == (2, 0, 0) and scores.types.f1 == 1.0
    assert tally(scores.values) == (1, 1, 1) and scores.values.f1 == 0.5
    assert scores.parse_rate == 0.5 and scores.valid_rate == 1.0
    without = score(gold, predicted, {"a": True}, TOOLS)
    assert tally(without.types) == (0, 0, 0) and without.parse_rate == 0.5  # parsed defaults to valid
