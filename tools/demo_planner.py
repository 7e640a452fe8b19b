"""The offline demo's scripted LLM: plans from the request's words and the files it names, a handful of rules.

No model understands anything here; a few keywords pick the tasks a real planner would plan for the example
requests (the web page's examples and the README's), one rule or more per task family:

    caption / describe -> image-to-text          classify / what kind -> image-classification
    detect / objects -> object-detection          segment -> image-segmentation     depth -> depth-estimation
    edges / outline / canny -> canny-control      a question about a picture -> visual-question-answering
    transcribe / an audio file -> automatic-speech-recognition     what sound -> audio-classification
    draw / picture of / paint -> text-to-image    names / people / places -> token-classification
    sentiment / positive or negative -> text-classification        translate -> translation
    summarize -> summarization                    read aloud / say / speak -> text-to-speech

A picture named in the request (an example, an upload, an earlier result) is what image tasks run on; with
no rule matched, a picture is captioned and classified, and words alone are drawn.
"""

from __future__ import annotations

import json
import re
from typing import Any

IMAGE_RE = re.compile(r"/(?:examples|uploads|images)/[\w.-]+\.(?:png|jpe?g|gif|webp|bmp)", re.I)
AUDIO_RE = re.compile(r"/(?:examples|uploads|audios)/[\w.-]+\.(?:wav|flac|mp3|ogg)", re.I)
QUOTED_RE = re.compile(r"[\"“'‘]([^\"”'’]{2,})[\"”'’]")

# (words that trigger it, task) for tasks on a picture, in the order they run
IMAGE_RULES = (
    (("caption", "describe", "what is in", "what's in", "tell me about"), "image-to-text"),
    (("classify", "what kind", "which animal", "what animal", "label"), "image-classification"),
    (("detect", "objects", "find the", "count"), "object-detection"),
    (("segment",), "image-segmentation"),
    (("depth", "how far"), "depth-estimation"),
    (("edge", "outline", "canny"), "canny-control"),
)
AUDIO_RULES = (
    (("transcribe", "what does it say", "what is said", "speech to text", "write down"), "automatic-speech-recognition"),
    (("what sound", "classify", "kind of sound", "what kind"), "audio-classification"),
)
TEXT_RULES = (
    (("names", "people", "places", "entities", "who and where"), "token-classification"),
    (("sentiment", "positive or negative", "mood", "tone"), "text-classification"),
    (("translate", "in german", "into german", "in french"), "translation"),
    (("summarize", "summarise", "summary", "shorten"), "summarization"),
)
DRAW_WORDS = ("draw", "picture of", "image of", "paint", "sketch", "generate an image", "make an image",
              "a photo of")
SPEAK_WORDS = ("aloud", "read it", "read the", "say it", "speak", "pronounce", "voice", "audio of")
TEXT_MAKERS = ("image-to-text", "automatic-speech-recognition", "translation", "summarization")


def request_of(body: dict[str, Any]) -> str:
    """The user's request inside the planner prompt (`... Now my request is { <request> }. ...`)."""
    content = body["messages"][-1]["content"]
    if "Now my request is {" in content:
        return content.split("Now my request is {", 1)[1].rsplit("}", 1)[0].strip()
    return content.strip()


def _any(words: str, keys: tuple[str, ...]) -> bool:
    return any(k in words for k in keys)


def _subject(request: str) -> str:
    """What to draw: the words after the drawing verb, without the trailing clauses ("and ...")."""
    low = request.lower()
    for verb in DRAW_WORDS:
        at = low.find(verb)
        if at >= 0:
            rest = request[at + len(verb):]
            rest = re.split(r"\b(?:and|then|,|\.)\b|[,.;]", rest, maxsplit=1)[0].strip(" :")
            if rest:
                return rest[:80]
    return request[:80]


def plan(request: str) -> list[dict[str, Any]]:
    """The task list for one request (JARVIS's format); [] for a plain chat."""
    low = request.lower()
    images = IMAGE_RE.findall(request)
    audios = AUDIO_RE.findall(request)
    quoted = QUOTED_RE.findall(request)
    tasks: list[dict[str, Any]] = []

    def add(task: str, dep: list[int], **args: str) -> int:
        tasks.append({"task": task, "id": len(tasks), "dep": dep or [-1], "args": args})
        return len(tasks) - 1

    image_source: str | None = images[0] if images else None
    image_dep: list[int] = []
    if image_source is None and _any(low, DRAW_WORDS):
        drawn = add("text-to-image", [], text=_subject(request))
        image_source, image_dep = f"<GENERATED>-{drawn}", [drawn]
    if image_source is not None:
        matched = [task for keys, task in IMAGE_RULES if _any(low, keys)]
        question = "?" in request and not matched and images
        if question:
            add("visual-question-answering", image_dep, image=image_source, text=request.split("?")[0][-120:] + "?")
        elif not matched and images:
            matched = ["image-to-text", "image-classification"]  # a photo and no rule: say what is in it
        for task in matched:
            add(task, image_dep, image=image_source)
    for audio in audios:
        matched = [task for keys, task in AUDIO_RULES if _any(low, keys)] or ["automatic-speech-recognition"]
        for task in matched:
            add(task, [], audio=audio)
    text = quoted[0] if quoted else None
    for keys, task in TEXT_RULES:
        if _any(low, keys):
            add(task, [], text=text or re.sub(IMAGE_RE, "", request).strip())
    if _any(low, SPEAK_WORDS):
        source = next((t for t in reversed(tasks) if t["task"] in TEXT_MAKERS), None)
        if source is not None:
            add("text-to-speech", [source["id"]], text=f"<GENERATED>-{source['id']}")
        else:
            add("text-to-speech", [], text=text or request[:200])
    if not tasks and request.strip():
        low_words = set(re.findall(r"[a-z]+", low))
        if low_words & {"hello", "hi", "hey", "thanks", "thank"} and len(low_words) <= 4:
            return []  # a greeting: a chat reply
        add("text-to-image", [], text=request[:80])  # words alone: draw them
    return tasks


def plan_reply(body: dict[str, Any]) -> str:
    return json.dumps(plan(request_of(body)))


def answer_reply(body: dict[str, Any]) -> str:
    """A short, readable answer in place of a real LLM's: what ran, what it made (raw results stay in the page)."""
    messages = body.get("messages", [])
    log = next((m["content"] for m in messages if m["role"] == "assistant"), "")
    tasks = re.findall(r'"task": "([a-z0-9-]+)", "id": (\d+)', log)
    files = sorted(set(re.findall(r"/(?:images|audios|videos)/[\w.-]+", log)))
    names = ", ".join(dict.fromkeys(t for t, _ in tasks)) or "no tasks"
    lines = [f"This is the **offline demo**: a scripted planner read your words and planned {names}; tiny "
             "random-weight models ran them on the real models server, so the outputs are noise.", ""]
    lines += [f"- {path}" for path in files] or ["- (no files were generated)"]
    lines += ["", "Add an LLM (see the README's Quick start) to get real plans and answers."]
    return "\n".join(lines)


def text_task_reply(body: dict[str, Any]) -> str:
    """Text tasks the LLM does itself (translation, summarization): say what a real LLM would do."""
    content = body["messages"][-1]["content"]
    found = re.search(r"Act as a ([\w-]+) system with the arguments (\{.*?\}) and give", content)
    task, args = (found.group(1), found.group(2)) if found else ("text", "{}")
    try:
        text = json.loads(args).get("text", "")
    except ValueError:
        text = ""
    return f"(offline demo: a real LLM would do the {task} of “{text[:120]}” here)"
