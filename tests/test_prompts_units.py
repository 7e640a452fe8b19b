"""What hugginggpt/prompts.py puts in front of the LLM, pinned message by message (mutation audit: docs/TESTING.md).

prompts.py builds every message of the three LLM stages: the planner's (parse_task), the model chooser's
(choose_model) and the answer writer's (response_results), from our configs or from a JARVIS config
(`PromptSet.from_jarvis`, behind bench/taskbench.py's --jarvis-prompt). A slip there changes what the LLM is
asked without anything else failing: a demo lost, a slot left as `{{task}}`, a text slot sent JSON-quoted, a
history trimmed too late or from the wrong end. So the messages are compared whole, with the expected text
written out here, for the configs and demos as shipped (configs/*.yaml, demos/) and for small configs and demo
files in tmp_path (custom, missing and broken ones, a JARVIS checkout's layout). The planner's history trimming
is pinned to the token: which turns go first, in what steps, and where the limit lies.
"""

from __future__ import annotations

import datetime
import io
import json
from pathlib import Path

import pytest
import yaml

from hugginggpt.config import load_config
from hugginggpt.errors import ConfigError
from hugginggpt.prompts import PromptSet, context_window, count_tokens, fill, load_demos

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_CONFIGS = ["config.azure.yaml", "config.default.yaml", "config.gradio.yaml", "config.lite.yaml",
                   "config.local.yaml"]

# -- what the shipped configs say (configs/*.yaml, all five alike) ------------------------------------------------

PLAN_SYSTEM_START = (
    "#1 Task Planning Stage: You turn a user request into a list of AI tasks, written as a JSON list: "
    '[{"task": task, "id": task_id, "dep": dependency_task_ids, "args": {"text": text or <GENERATED>-dep_id, '
    '"image": image_url or <GENERATED>-dep_id, "audio": audio_url or <GENERATED>-dep_id}}]. '
    '"<GENERATED>-dep_id" stands for the text, image or audio produced by task dep_id (check that this task really '
    'produces that kind of resource), and dep_id must appear in "dep". "dep" lists the ids of the earlier tasks whose '
    'outputs this task needs, or [-1] when it needs none. "args" may only contain "text", "image" and "audio". '
    '"task" must be one of: "token-classification", "text2text-generation", '
)
PLAN_SYSTEM_END = (
    '"openpose-text-to-image", "seg-text-to-image". The same task type may appear several times. Use as few tasks as '
    "solve the request, mind the order of tasks and the types of their inputs and outputs, and answer with the JSON "
    "list only. If the request needs no AI task, answer []."
)
CHOOSE_SYSTEM = (
    "#2 Model Selection Stage: Given the user request and one parsed task, pick the model most likely to solve it "
    "from the candidate list. Weigh each model's description and tags most; prefer models with a local inference "
    "endpoint, which are faster and more reliable."
)
RESPOND_SYSTEM = (
    "#4 Response Generation Stage: From the task execution log, answer the user's request directly, then describe "
    "the workflow: the tasks, the models used and what each produced."
)
RESPOND_PROMPT = (
    "Yes. First answer my request directly, based on the inference results; some results may be wrong, so weigh them "
    "carefully. Then describe your workflow, with the models used and their results, in a friendly tone, leaving out "
    "what is not relevant. Give the complete path or URL of every file in the results. If the results contain "
    "nothing useful, tell me you could not do it."
)
# The same texts are prompts.py's defaults, for a config that leaves a stage out; its planning prompt lists every
# task type the plan reader knows (text-classification included) and says nothing about repeated types.
DEFAULT_PLAN_SYSTEM = (
    "#1 Task Planning Stage: You turn a user request into a list of AI tasks, written as a JSON list: "
    '[{"task": task, "id": task_id, "dep": dependency_task_ids, "args": {"text": text or <GENERATED>-dep_id, '
    '"image": image_url or <GENERATED>-dep_id, "audio": audio_url or <GENERATED>-dep_id}}]. '
    '"<GENERATED>-dep_id" stands for the text, image or audio produced by task dep_id (check that this task really '
    'produces that kind of resource), and dep_id must appear in "dep". "dep" lists the ids of the earlier tasks whose '
    'outputs this task needs, or [-1] when it needs none. "args" may only contain "text", "image" and "audio". '
    '"task" must be one of: "token-classification", "text2text-generation", "summarization", "translation", '
    '"question-answering", "conversational", "text-generation", "sentence-similarity", "tabular-classification", '
    '"text-classification", "object-detection", "image-classification", "image-to-image", "image-to-text", '
    '"text-to-image", "text-to-video", "visual-question-answering", "document-question-answering", '
    '"image-segmentation", "depth-estimation", "text-to-speech", "automatic-speech-recognition", "audio-to-audio", '
    '"audio-classification", "canny-control", "hed-control", "mlsd-control", "normal-control", "openpose-control", '
    '"canny-text-to-image", "depth-text-to-image", "hed-text-to-image", "mlsd-text-to-image", "normal-text-to-image", '
    '"openpose-text-to-image", "seg-text-to-image". Use as few tasks as solve the request, mind the order of tasks '
    "and the types of their inputs and outputs, and answer with the JSON list only. If the request needs no AI task, "
    "answer []."
)

# -- a request as the stages meet it ------------------------------------------------------------------------------

HISTORY = [
    {"role": "user", "content": "Draw a red fox", "name": "alice"},  # anything but role and content stays out
    {"role": "assistant", "content": "Here it is.\nGenerated files: /images/fox.png"},
]
CAPTION_TASK = {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/images/fox.png"}}
METAS = [
    {"id": "Salesforce/blip-image-captioning-large", "inference endpoint": ["local"], "likes": 1043,
     "description": "Légende d'images", "tags": ["image-to-text"]},
    {"id": "nlpconnect/vit-gpt2-image-captioning", "inference endpoint": [], "likes": 640,
     "description": "ViT + GPT-2", "tags": ["image-captioning"]},
]
PROCESSES = [
    {"task": CAPTION_TASK, "inference result": {"generated text": "un renard roux dans la neige"},
     "choose model result": {"id": "Salesforce/blip-image-captioning-large", "reason": "local"}},
]
PROCESSES_JSON = (
    '[{"task": {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/images/fox.png"}}, '
    '"inference result": {"generated text": "un renard roux dans la neige"}, '
    '"choose model result": {"id": "Salesforce/blip-image-captioning-large", "reason": "local"}}]'
)
METAS_JSON = (
    '[{"id": "Salesforce/blip-image-captioning-large", "inference endpoint": ["local"], "likes": 1043, '
    '"description": "Légende d\'images", "tags": ["image-to-text"]}, '
    '{"id": "nlpconnect/vit-gpt2-image-captioning", "inference endpoint": [], "likes": 640, '
    '"description": "ViT + GPT-2", "tags": ["image-captioning"]}]'
)
TASK_JSON = '{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/images/fox.png"}}'


def shipped(name: str = "config.default.yaml") -> PromptSet:
    return PromptSet.from_config(load_config(ROOT / "configs" / name, need_llm=False))


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def assert_shipped_stages(prompts: PromptSet) -> None:
    """The three stages' messages with the shipped prompts and demos, for one request."""
    plan = prompts.parse_task(HISTORY, "Caption /images/fox.png in French", "gpt-4o-mini")
    assert [m["role"] for m in plan] == ["system"] + ["user", "assistant"] * 7 + ["user"]
    assert plan[0]["content"].startswith(PLAN_SYSTEM_START) and plan[0]["content"].endswith(PLAN_SYSTEM_END)
    assert plan[1] == {"role": "user",
                       "content": "Tell me how many dogs are in /examples/dogs.jpg and read the answer out loud."}
    assert plan[14] == {"role": "assistant", "content": (
        '[{"task": "image-segmentation", "id": 0, "dep": [-1], "args": {"image": "/examples/coffee.png"}}, '
        '{"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}]')}
    assert plan[1:15] == json.loads((ROOT / "demos" / "demo_parse_task.json").read_text(encoding="utf-8"))
    assert plan[15] == {"role": "user", "content": (
        'The chat log [ [{"role": "user", "content": "Draw a red fox"}, {"role": "assistant", "content": '
        '"Here it is.\\nGenerated files: /images/fox.png"}] ] may mention resources I refer to. Now my request is '
        "{ Caption /images/fox.png in French }. Mind the input and output types of the tasks and the dependencies "
        "between them.")}

    assert prompts.choose_model("Caption /images/fox.png in French", CAPTION_TASK, METAS) == [
        {"role": "system", "content": CHOOSE_SYSTEM},
        {"role": "user", "content": "Caption /images/fox.png in French"},
        {"role": "assistant", "content": TASK_JSON},
        {"role": "user", "content": f"Please choose the most suitable model from {METAS_JSON} for the task {TASK_JSON}. "
                                    'Answer in strict JSON: {"id": "id", "reason": "your detailed reason for the choice"}.'},
    ]

    assert prompts.response_results("Caption /images/fox.png in French", PROCESSES) == [
        {"role": "system", "content": RESPOND_SYSTEM},
        {"role": "user", "content": "Caption /images/fox.png in French"},
        {"role": "assistant", "content": "Before I answer, here is the workflow I ran for your request, as a JSON "
                                         f"execution log: {PROCESSES_JSON}. Do you have any wishes for how I should "
                                         "present the answer?"},
        {"role": "user", "content": RESPOND_PROMPT},
    ]


# -- token counting and context windows ---------------------------------------------------------------------------


def test_count_tokens_is_a_quarter_of_the_characters_rounded_down_plus_one():
    assert [count_tokens(text) for text in ("", "abc", "abcd", "abcdefg", "abcdefgh")] == [1, 1, 2, 2, 3]
    assert count_tokens("x" * 4000) == 1001
    assert count_tokens("été à Tōkyō") == 3  # characters, not bytes


def test_known_models_get_their_published_context_window():
    assert {name: context_window(name) for name in ("text-davinci-003", "gpt-3.5-turbo", "gpt-3.5-turbo-16k", "gpt-4",
                                                    "gpt-4-32k", "gpt-4-turbo", "gpt-4o", "gpt-4o-mini", "gpt-4.1",
                                                    "gpt-4.1-mini")} == {
        "text-davinci-003": 4096, "gpt-3.5-turbo": 4096, "gpt-3.5-turbo-16k": 16384, "gpt-4": 8192,
        "gpt-4-32k": 32768, "gpt-4-turbo": 128000, "gpt-4o": 128000, "gpt-4o-mini": 128000, "gpt-4.1": 1000000,
        "gpt-4.1-mini": 1000000}


def test_a_dated_model_name_gets_the_window_of_its_longest_known_prefix():
    assert context_window("gpt-4-32k-0613") == 32768  # not gpt-4's 8192
    assert context_window("gpt-3.5-turbo-16k-0613") == 16384  # not gpt-3.5-turbo's 4096
    assert context_window("gpt-4-turbo-2024-04-09") == 128000
    assert context_window("gpt-4o-mini-2024-07-18") == 128000
    assert context_window("gpt-4.1-nano") == 1000000
    assert context_window("gpt-4-0613") == 8192


def test_an_unknown_model_gets_8192_tokens_and_a_configured_window_always_wins():
    assert context_window("qwen2.5:7b-instruct") == 8192
    assert context_window("openai/gpt-4o") == 8192  # a prefix is matched at the start only
    assert context_window("gpt-4o", 32000) == 32000
    assert context_window("qwen2.5:7b-instruct", "16384") == 16384  # as a YAML string
    assert context_window("gpt-3.5-turbo", None) == 4096 and context_window("gpt-3.5-turbo", 0) == 4096


# -- fill --------------------------------------------------------------------------------------------------------


def test_fill_puts_text_in_as_it_is_and_any_other_value_as_json_keeping_non_ascii():
    filled = fill("{{a}} | {{b}} | {{c}} | {{d}} | {{e}}",
                  {"a": 'say "hi"\nthen stop', "b": {"text": "été", "n": 3}, "c": None, "d": [True, 1.5], "e": "東京"})
    assert filled == 'say "hi"\nthen stop | {"text": "été", "n": 3} | null | [true, 1.5] | 東京'


def test_fill_writes_a_value_json_cannot_encode_as_its_text():
    slots = {"processes": [{"generated image": Path("/images/a.png"), "day": datetime.date(2024, 5, 1)}]}
    assert fill("log: {{processes}}", slots) == 'log: [{"generated image": "/images/a.png", "day": "2024-05-01"}]'


def test_fill_replaces_every_occurrence_and_never_fails_on_a_slot_it_lacks_or_does_not_use():
    template = "{{input}} and again {{input}}; {input}, {{ input }}, {{other}}, {}"
    assert fill(template, {"input": "fox", "unused": [1]}) == "fox and again fox; {input}, {{ input }}, {{other}}, {}"
    assert fill(template, {}) == template


# -- demo files ---------------------------------------------------------------------------------------------------


def test_demos_load_as_the_messages_in_the_file_with_any_of_the_three_roles(tmp_path):
    messages = [{"role": "system", "content": "Réponds en JSON."}, {"role": "user", "content": "Dessine un renard"},
                {"role": "assistant", "content": '[{"task": "text-to-image", "id": 0}]'}]
    assert load_demos(write(tmp_path / "demos.json", messages), tmp_path / "config.yaml") == messages
    assert load_demos(write(tmp_path / "none.json", "[]"), tmp_path / "config.yaml") == []


def test_a_missing_demos_file_names_the_config_and_the_path_it_looked_for(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_demos(tmp_path / "demos" / "nowhere.json", tmp_path / "config.yaml")
    assert str(err.value) == (f"{tmp_path / 'config.yaml'}: demos file not found: {tmp_path / 'demos' / 'nowhere.json'} "
                              "(see `demos_or_presteps`)")


def test_a_demos_file_that_is_not_json_says_which_line(tmp_path):
    path = write(tmp_path / "demos.json", '[\n  {"role": "user", "content": "hi"}\n  {"role": "assistant", "content": "[]"}\n]\n')
    with pytest.raises(ConfigError) as err:
        load_demos(path, tmp_path / "config.yaml")
    assert str(err.value) == f"{path}: not valid JSON (line 3: Expecting ',' delimiter)"


@pytest.mark.parametrize("text", [
    "{}",
    '{"role": "user", "content": "hi"}',
    '"just text"',
    '["hi"]',
    '[{"role": "robot", "content": "hi"}]',
    '[{"role": "user", "content": "hi"}, {"role": "Assistant", "content": "[]"}]',
    '[{"role": "user"}]',
    '[{"role": "user", "content": 3}]',
    '[{"content": "hi"}]',
    '[{"role": "user", "content": "hi"}, null]',
])
def test_demos_that_are_not_a_list_of_role_and_content_messages_are_refused(tmp_path, text):
    path = write(tmp_path / "demos.json", text)
    with pytest.raises(ConfigError) as err:
        load_demos(path, tmp_path / "config.yaml")
    assert str(err.value) == f'{path}: must be a JSON list of {{"role", "content"}} messages'


def test_demos_and_jarvis_configs_are_read_as_utf8_on_a_machine_whose_locale_is_not(tmp_path, monkeypatch):
    demos = [{"role": "user", "content": "Décris l'image /examples/café.jpg"}, {"role": "assistant", "content": "[]"}]
    path = write(tmp_path / "demos" / "demo_parse_task.json", demos)
    config = write(tmp_path / "configs" / "config.yaml", yaml.safe_dump({
        "tprompt": {"parse_task": "Planifie en français."}, "prompt": {"parse_task": "Requête : {{input}}"},
        "demos_or_presteps": {"parse_task": "demos/demo_parse_task.json"}}, allow_unicode=True))
    # as on Windows: a file opened without an encoding is read in the locale's (cp1252), not UTF-8
    monkeypatch.setattr(io, "text_encoding", lambda encoding, stacklevel=2: encoding or "cp1252")
    assert load_demos(path, tmp_path / "config.yaml") == demos
    assert PromptSet.from_jarvis(config).parse_task([], "été", "gpt-4o") == [
        {"role": "system", "content": "Planifie en français."}, *demos, {"role": "user", "content": "Requête : été"}]


# -- our prompts: the configs as shipped, and configs that change them ---------------------------------------------


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_each_shipped_config_asks_the_three_stages_with_our_prompts_and_demos(name):
    assert_shipped_stages(shipped(name))


def test_a_config_without_prompts_gets_the_defaults_and_an_empty_one_counts_as_unset(tmp_path):
    config = write(tmp_path / "configs" / "config.yaml", yaml.safe_dump({
        "tprompt": {"choose_model": ""},
        "prompt": {"response_results": "Answer {{input}} from {{processes}}."},
        "demos_or_presteps": {"parse_task": str(write(tmp_path / "plan.json", [])),
                              "choose_model": str(write(tmp_path / "choose.json", [])),
                              "response_results": str(write(tmp_path / "respond.json", []))}}))
    prompts = PromptSet.from_config(load_config(config, need_llm=False))
    assert prompts.parse_task([], "draw a fox", "gpt-4o") == [
        {"role": "system", "content": DEFAULT_PLAN_SYSTEM},
        {"role": "user", "content": "The chat log [ [] ] may mention resources I refer to. Now my request is "
                                    "{ draw a fox }. Mind the input and output types of the tasks and the dependencies "
                                    "between them."}]
    assert prompts.choose_model("caption it", {"task": "image-to-text"}, [{"id": "m"}]) == [
        {"role": "system", "content": CHOOSE_SYSTEM},
        {"role": "user", "content": 'Please choose the most suitable model from [{"id": "m"}] for the task '
                                    '{"task": "image-to-text"}. Answer in strict JSON: {"id": "id", "reason": '
                                    '"your detailed reason for the choice"}.'}]
    assert prompts.response_results("caption it", [{"ok": 1}]) == [
        {"role": "system", "content": RESPOND_SYSTEM},
        {"role": "user", "content": 'Answer caption it from [{"ok": 1}].'}]


def test_custom_demos_are_filled_per_stage_but_the_planners_are_sent_as_written(tmp_path):
    plan = [{"role": "user", "content": "{{input}}: draw a fox"}, {"role": "assistant", "content": "[]"}]
    choose = [{"role": "system", "content": "Task {{task}}, asked as {{input}}; candidates {{metas}}."}]
    respond = [{"role": "assistant", "content": "{{input}} -> {{processes}}; {{task}}"}]
    config = write(tmp_path / "configs" / "config.yaml", yaml.safe_dump({
        "tprompt": {"parse_task": "Plan.", "choose_model": "Choose.", "response_results": "Answer."},
        "prompt": {"parse_task": "{{input}}", "choose_model": "{{task}}", "response_results": "{{input}}"},
        "demos_or_presteps": {"parse_task": str(write(tmp_path / "plan.json", plan)),
                              "choose_model": str(write(tmp_path / "choose.json", choose)),
                              "response_results": str(write(tmp_path / "respond.json", respond))}}))
    prompts = PromptSet.from_config(load_config(config, need_llm=False))
    assert prompts.parse_task([], "now", "gpt-4o") == [
        {"role": "system", "content": "Plan."}, {"role": "user", "content": "{{input}}: draw a fox"},
        {"role": "assistant", "content": "[]"}, {"role": "user", "content": "now"}]
    assert prompts.choose_model("caption", {"id": 0}, [{"id": "m"}]) == [
        {"role": "system", "content": "Choose."},
        {"role": "system", "content": 'Task {"id": 0}, asked as caption; candidates [{"id": "m"}].'},
        {"role": "user", "content": '{"id": 0}'}]
    assert prompts.response_results("caption", [{"generated text": "un renard"}]) == [
        {"role": "system", "content": "Answer."},
        {"role": "assistant", "content": 'caption -> [{"generated text": "un renard"}]; {{task}}'},
        {"role": "user", "content": "caption"}]


def test_a_config_naming_a_missing_demos_file_says_which_config_and_which_file(tmp_path):
    missing = tmp_path / "demos" / "nowhere.json"
    config = write(tmp_path / "configs" / "config.yaml", yaml.safe_dump({"demos_or_presteps": {"choose_model": str(missing)}}))
    with pytest.raises(ConfigError) as err:
        PromptSet.from_config(load_config(config, need_llm=False))
    assert str(err.value) == f"{config}: demos file not found: {missing} (see `demos_or_presteps`)"


# -- the planner's history and the context window -------------------------------------------------------------------

# "Plan." (5 characters) + the user message "log=<history as JSON> ask=fox" (12 + the JSON); no demos.
TRIM = PromptSet(tprompt={"parse_task": "Plan."}, prompt={"parse_task": "log={{context}} ask={{input}}"}, demos={})
LONG_ASK = "draw a red fox in the snow, with pine trees behind it and a low winter sun over the hills"
CONVERSATION = [  # prompt tokens with the history from message N on: 0: 101 (400 chars), 1: 70, 2: 55, 3: 45, 4: 31, 6: 5
    {"role": "user", "content": LONG_ASK}, {"role": "assistant", "content": "done: /images/fox.png"},
    {"role": "user", "content": "caption it"}, {"role": "assistant", "content": "a red fox in snow"},
    {"role": "user", "content": "read it aloud"}, {"role": "assistant", "content": "done: /audios/c.flac"},
]
LAST_TWO_TURNS = ('log=[{"role": "user", "content": "caption it"}, {"role": "assistant", "content": "a red fox in snow"}, '
                  '{"role": "user", "content": "read it aloud"}, {"role": "assistant", "content": "done: /audios/c.flac"}] '
                  "ask=fox")


def planner_prompt(prompts: PromptSet, context: list[dict], window: int, model: str = "gpt-4o") -> str:
    messages = prompts.parse_task(context, "fox", model, window)
    return messages[-1]["content"]


def test_a_history_that_fits_to_the_token_is_sent_whole_and_one_token_more_drops_the_oldest_turn():
    # 800 tokens are kept for the reply: a window of 901 leaves 101 for the prompt, which is exactly that long
    whole = planner_prompt(TRIM, CONVERSATION, 901)
    assert whole.startswith(f'log=[{{"role": "user", "content": "{LONG_ASK}"}}, {{"role": "assistant", ')
    assert whole.endswith('{"role": "assistant", "content": "done: /audios/c.flac"}] ask=fox')
    assert planner_prompt(TRIM, CONVERSATION, 900) == LAST_TWO_TURNS


def test_the_oldest_turn_goes_with_its_reply_even_when_dropping_the_turn_alone_would_fit():
    # without the first message the prompt would be 70 tokens, under the 80 left; its reply goes with it (55)
    assert planner_prompt(TRIM, CONVERSATION, 880) == LAST_TWO_TURNS
    assert TRIM.parse_task(CONVERSATION, "fox", "gpt-4o", 880) == [
        {"role": "system", "content": "Plan."}, {"role": "user", "content": LAST_TWO_TURNS}]


def test_a_long_history_loses_whole_exchanges_oldest_first_until_it_fits():
    assert planner_prompt(TRIM, CONVERSATION, 840) == (
        'log=[{"role": "user", "content": "read it aloud"}, {"role": "assistant", "content": "done: /audios/c.flac"}] '
        "ask=fox")


def test_a_reply_is_not_kept_without_the_turn_it_answers():
    # the reply alone (15 tokens) would fit in the 20 left; the pair goes together and the history is empty (5)
    context = [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "ok"}]
    assert planner_prompt(TRIM, context, 820) == "log=[] ask=fox"


def test_the_request_is_sent_even_when_nothing_of_the_history_is_left_and_it_still_does_not_fit():
    assert planner_prompt(TRIM, CONVERSATION, 803) == "log=[] ask=fox"
    odd = [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "y"}]
    assert TRIM.parse_task(odd, "fox", "gpt-4o", 801) == [
        {"role": "system", "content": "Plan."}, {"role": "user", "content": "log=[] ask=fox"}]
    assert TRIM.parse_task([], "fox", "gpt-4o", 1) == [
        {"role": "system", "content": "Plan."}, {"role": "user", "content": "log=[] ask=fox"}]


def test_demos_and_the_system_prompt_count_against_the_window():
    # the demos add "hi" + "[]" (4 characters): the 400 above become 404, 102 tokens, one over a window of 901
    with_demos = PromptSet(tprompt=TRIM.tprompt, prompt=TRIM.prompt,
                           demos={"parse_task": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "[]"}]})
    assert with_demos.parse_task(CONVERSATION, "fox", "gpt-4o", 901) == [
        {"role": "system", "content": "Plan."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "[]"},
        {"role": "user", "content": LAST_TWO_TURNS}]
    assert planner_prompt(with_demos, CONVERSATION, 902).startswith(f'log=[{{"role": "user", "content": "{LONG_ASK}"}}')


def test_without_a_configured_window_the_model_names_it():
    # the shipped prompt and demos are about 1,000 tokens; a 20,000-character turn is 5,000 more
    prompts = shipped()
    context = [{"role": "user", "content": "an old request " + "z" * 20_000}, {"role": "assistant", "content": "done"}]
    kept = '[ [{"role": "user", "content": "an old request zzz'
    assert kept in prompts.parse_task(context, "fox", "llama3")[-1]["content"]  # 8192 tokens
    assert kept in prompts.parse_task(context, "fox", "gpt-3.5-turbo-16k-0613")[-1]["content"]
    assert prompts.parse_task(context, "fox", "gpt-3.5-turbo")[-1]["content"].startswith("The chat log [ [] ] ")
    assert prompts.parse_task(context, "fox", "llama3", 4096)[-1]["content"].startswith("The chat log [ [] ] ")
    assert kept in prompts.parse_task(context, "fox", "gpt-3.5-turbo", 16384)[-1]["content"]


# -- JARVIS's prompts (from_jarvis) ----------------------------------------------------------------------------------

JARVIS_TPROMPT = {
    "parse_task": "#1 Task Planning Stage: The AI assistant can parse user input to several tasks: [...] (JARVIS's).",
    "choose_model": "#2 Model Selection Stage: Given the user request and the parsed tasks, the AI assistant helps "
                    "the user to select a suitable model from a list of models (JARVIS's).",
    "response_results": "#4 Response Generation Stage: With the task execution logs, the AI assistant needs to "
                        "describe the process and inference results.",
}
JARVIS_PROMPT = {
    "parse_task": "The chat log [ {{context}} ] may contain the resources I mentioned. Now I input { {{input}} }. "
                  "Pay attention to the input and output types of tasks and the dependencies between tasks.",
    "choose_model": "Please choose the most suitable model from {{metas}} for the task {{task}}. The output must be in "
                    'a strict JSON format: {"id": "id", "reason": "your detail reasons for the choice"}.',
    "response_results": "Yes. Please first think carefully and directly answer my request based on the inference "
                        "results.",
}
JARVIS_DEMOS = {
    "parse_task": [{"role": "user", "content": "Look at /e1.jpg, what is in it?"},
                   {"role": "assistant", "content": '[{"task": "image-to-text", "id": 0, "dep": [-1], '
                                                    '"args": {"image": "/e1.jpg"}}]'}],
    "choose_model": [{"role": "user", "content": "{{input}}"}, {"role": "assistant", "content": "{{task}}"}],
    "response_results": [{"role": "user", "content": "{{input}}"},
                         {"role": "assistant", "content": "Before give you a response, I want to introduce my workflow "
                                                          "for your request, which is shown in the following JSON data: "
                                                          "{{processes}}. Do you have any demands regarding my response?"}],
}
JARVIS_NAMES = {stage: f"demos/demo_{stage}.json" for stage in JARVIS_DEMOS}


NEEDS_PLANNING = "a JARVIS config needs tprompt, prompt and demos_or_presteps entries for parse_task"


def jarvis_refusal(config: Path) -> str:
    """The one-line ConfigError a user gets for this JARVIS config."""
    with pytest.raises(ConfigError) as err:
        PromptSet.from_jarvis(config)
    return str(err.value)


def jarvis_checkout(tmp_path: Path, demos: dict | None = None, **sections) -> Path:
    """A folder laid out like JARVIS's hugginggpt/server: configs/config.default.yaml naming demos/ beside configs/."""
    server = tmp_path / "JARVIS" / "hugginggpt" / "server"
    for stage, messages in (JARVIS_DEMOS if demos is None else demos).items():
        write(server / "demos" / f"demo_{stage}.json", messages)
    data = {"model": "text-davinci-003", "tprompt": JARVIS_TPROMPT, "prompt": JARVIS_PROMPT,
            "demos_or_presteps": JARVIS_NAMES, **sections}
    return write(server / "configs" / "config.default.yaml", yaml.safe_dump(data))


def test_a_jarvis_checkout_asks_every_stage_with_its_own_prompts_and_demos(tmp_path):
    prompts = PromptSet.from_jarvis(str(jarvis_checkout(tmp_path)))
    assert prompts.parse_task(HISTORY[:1], "Caption /e2.jpg", "text-davinci-003") == [
        {"role": "system", "content": JARVIS_TPROMPT["parse_task"]}, *JARVIS_DEMOS["parse_task"],
        {"role": "user", "content": 'The chat log [ [{"role": "user", "content": "Draw a red fox"}] ] may contain the '
                                    "resources I mentioned. Now I input { Caption /e2.jpg }. Pay attention to the input "
                                    "and output types of tasks and the dependencies between tasks."}]
    assert prompts.choose_model("Caption /e2.jpg", CAPTION_TASK, METAS) == [
        {"role": "system", "content": JARVIS_TPROMPT["choose_model"]},
        {"role": "user", "content": "Caption /e2.jpg"}, {"role": "assistant", "content": TASK_JSON},
        {"role": "user", "content": f"Please choose the most suitable model from {METAS_JSON} for the task {TASK_JSON}. "
                                    'The output must be in a strict JSON format: {"id": "id", "reason": "your detail '
                                    'reasons for the choice"}.'}]
    assert prompts.response_results("Caption /e2.jpg", PROCESSES) == [
        {"role": "system", "content": JARVIS_TPROMPT["response_results"]},
        {"role": "user", "content": "Caption /e2.jpg"},
        {"role": "assistant", "content": "Before give you a response, I want to introduce my workflow for your request, "
                                         f"which is shown in the following JSON data: {PROCESSES_JSON}. Do you have any "
                                         "demands regarding my response?"},
        {"role": "user", "content": JARVIS_PROMPT["response_results"]}]


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_our_shipped_configs_read_as_jarvis_configs_give_the_same_messages(name):
    # configs/ and demos/ sit side by side here as in JARVIS's server folder
    assert_shipped_stages(PromptSet.from_jarvis(ROOT / "configs" / name))


def test_jarvis_demos_are_looked_up_beside_the_configs_folder_first_then_inside_it(tmp_path):
    config = jarvis_checkout(tmp_path, demos={"parse_task": JARVIS_DEMOS["parse_task"]})
    inside = [{"role": "user", "content": "(a copy inside configs/)"}, {"role": "assistant", "content": "[]"}]
    write(config.parent / "demos" / "demo_parse_task.json", inside)  # loses to the one beside configs/
    write(config.parent / "demos" / "demo_response_results.json", [{"role": "user", "content": "only here: {{input}}"}])
    prompts = PromptSet.from_jarvis(config)
    assert prompts.parse_task([], "hi", "gpt-4o")[1:3] == JARVIS_DEMOS["parse_task"]
    assert prompts.response_results("hi", [])[1] == {"role": "user", "content": "only here: hi"}


def test_a_jarvis_stage_without_its_demos_file_or_entries_is_asked_without_demos_or_with_our_prompts(tmp_path):
    config = jarvis_checkout(tmp_path, demos={"parse_task": JARVIS_DEMOS["parse_task"]},
                             tprompt={"parse_task": "Plan (theirs)."}, prompt={"parse_task": "{{input}}"},
                             demos_or_presteps={"parse_task": JARVIS_NAMES["parse_task"],
                                                "choose_model": JARVIS_NAMES["choose_model"]})  # not in the checkout
    prompts = PromptSet.from_jarvis(config)
    assert prompts.parse_task([], "hi", "gpt-4o") == [
        {"role": "system", "content": "Plan (theirs)."}, *JARVIS_DEMOS["parse_task"], {"role": "user", "content": "hi"}]
    assert prompts.choose_model("hi", {"id": 0}, [{"id": "m"}]) == [
        {"role": "system", "content": CHOOSE_SYSTEM},
        {"role": "user", "content": 'Please choose the most suitable model from [{"id": "m"}] for the task {"id": 0}. '
                                    'Answer in strict JSON: {"id": "id", "reason": "your detailed reason for the choice"}.'}]
    assert prompts.response_results("hi", []) == [
        {"role": "system", "content": RESPOND_SYSTEM}, {"role": "user", "content": RESPOND_PROMPT}]


def test_a_jarvis_checkout_without_its_planning_demos_names_the_file_it_looked_for(tmp_path):
    config = jarvis_checkout(tmp_path, demos={"choose_model": JARVIS_DEMOS["choose_model"]})
    assert jarvis_refusal(config) == (f"{config}: demos file not found: {config.parent.parent / 'demos' / 'demo_parse_task.json'}"
                              " (see `demos_or_presteps`)")


def test_a_jarvis_checkout_with_broken_demos_names_the_file(tmp_path):
    config = jarvis_checkout(tmp_path)
    broken = write(config.parent.parent / "demos" / "demo_choose_model.json", '[{"role": "user", "content": "{{input}}"},]')
    assert jarvis_refusal(config) == f"{broken}: not valid JSON (line 1: Expecting value)"


def test_a_jarvis_config_that_does_not_exist_says_where_to_find_one(tmp_path):
    with pytest.raises(ConfigError) as err:
        PromptSet.from_jarvis(tmp_path / "JARVIS" / "config.yaml")
    assert str(err.value) == (f"{tmp_path / 'JARVIS' / 'config.yaml'}: no such JARVIS config file "
                              "(e.g. JARVIS/hugginggpt/server/configs/config.default.yaml)")


def test_a_jarvis_config_that_is_not_yaml_says_so_with_yamls_reason(tmp_path):
    config = write(tmp_path / "configs" / "config.yaml", "tprompt: [unclosed\n")
    with pytest.raises(ConfigError) as err:
        PromptSet.from_jarvis(config)
    assert str(err.value).startswith(f"{config}: not valid YAML (while parsing a flow sequence\n")
    assert "expected ',' or ']', but got '<stream end>'" in str(err.value)


@pytest.mark.parametrize("change", [
    {"tprompt": {"choose_model": "no planning prompt"}},
    {"tprompt": "a string, not a mapping"},
    {"prompt": {"parse_task": ""}},
    {"prompt": None},
    {"demos_or_presteps": {"choose_model": "demos/demo_choose_model.json"}},
    {"demos_or_presteps": ["demos/demo_parse_task.json"]},
])
def test_a_jarvis_config_without_the_three_planning_entries_is_refused(tmp_path, change):
    config = jarvis_checkout(tmp_path, **change)
    assert jarvis_refusal(config) == f"{config}: {NEEDS_PLANNING}"


@pytest.mark.parametrize("text", ["", "- a list\n- not a mapping\n", "just a string\n"])
def test_an_empty_jarvis_config_or_one_that_is_not_a_mapping_is_refused_in_words(tmp_path, text):
    config = write(tmp_path / "configs" / "config.yaml", text)
    assert jarvis_refusal(config) == f"{config}: {NEEDS_PLANNING}"


def test_files_that_are_not_utf8_are_refused_in_words(tmp_path):
    """A demos file or JARVIS config saved as UTF-16 (Notepad's "Unicode") is a ConfigError naming the file."""
    demos = tmp_path / "demos.json"
    demos.write_bytes('[{"role": "user", "content": "hi"}]'.encode("utf-16"))
    with pytest.raises(ConfigError) as err:
        load_demos(demos, tmp_path / "config.yaml")
    assert str(err.value) == f"{demos}: not UTF-8 text (save it as UTF-8)"
    config = jarvis_checkout(tmp_path)
    config.write_bytes(config.read_text().encode("utf-16"))
    assert jarvis_refusal(config) == f"{config}: not UTF-8 text (save it as UTF-8)"


@pytest.mark.parametrize("empty", [None, ""])
def test_a_jarvis_stage_left_empty_gets_ours_and_one_that_is_not_text_is_refused(tmp_path, empty):
    config = jarvis_checkout(tmp_path, prompt={**JARVIS_PROMPT, "response_results": empty})
    prompts = PromptSet.from_jarvis(config)
    assert prompts.response_results("hi", [])[-1] == shipped().response_results("hi", [])[-1]
    config = jarvis_checkout(tmp_path, demos_or_presteps={**JARVIS_NAMES, "choose_model": 3})
    assert jarvis_refusal(config) == f"{config}: demos_or_presteps.choose_model must be text, got '3'"


def test_fill_never_fills_a_slot_named_inside_a_value_it_put_in():
    """A user who writes `{{metas}}`, or a past turn that quotes `{{input}}`, is sent as written."""
    assert fill("{{input}} | {{metas}}", {"input": "compare {{metas}} please", "metas": [1]}) == \
        "compare {{metas}} please | [1]"
    assert fill("{{context}} now {{input}}", {"context": [{"content": "{{input}}"}], "input": "x"}) == \
        '[{"content": "{{input}}"}] now x'


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_each_shipped_planning_prompt_offers_every_task_the_plan_reader_accepts(name):
    from hugginggpt.plan import TASK_TYPES

    text = load_config(ROOT / "configs" / name, need_llm=False).tprompt["parse_task"]
    listed = text.split('"task" must be one of: ')[1].split(". ")[0]
    assert listed == ", ".join(f'"{t}"' for t in TASK_TYPES)
    assert '"text-classification"' in listed  # JARVIS's own list left it out
