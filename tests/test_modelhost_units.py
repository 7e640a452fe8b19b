"""The local models server in-process: hugginggpt/modelhost/app.py through Flask's test client, and
hugginggpt/modelhost/handlers.py on the tiny real models tests/tiny_models.py builds (or small stand-ins where no
model is needed), each pinned where a client would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import array
import base64
import dataclasses
import io
import logging
import math
import re
import socket
import time
import types
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from hugginggpt.errors import BadRequest, ResourceError
from hugginggpt.httpbody import BODY_GATE, Refusal, headers_of
from hugginggpt.modelhost import handlers as h
from hugginggpt.modelhost.app import create_app
from hugginggpt.modelhost.batching import batch_size_var
from hugginggpt.modelhost.discover import Discovery, DiscoveryPolicy, DiscoveryRefused
from hugginggpt.modelhost.engine import LocalEngine
from hugginggpt.modelhost.handlers import Inputs
from hugginggpt.modelhost.pool import InferenceFailed, Loaded, ModelPool, ModelUnavailable, NoRoom
from hugginggpt.modelhost.registry import ModelSpec, Registry
from hugginggpt.urlpolicy import UrlPolicy
from tests.conftest import make_public
from tests.tiny_models import AUDIO_LABELS, VQA_ANSWERS, build_all

NER = "dslim/bert-base-NER"
SST = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"
VIT = "google/vit-base-patch16-224"
GPT2 = "openai-community/gpt2"
BART = "sshleifer/distilbart-cnn-12-6"
SQUAD = "deepset/roberta-base-squad2"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
FULL_ONLY = "stable-diffusion-v1-5/stable-diffusion-v1-5"  # in the catalog, at the full level only


# -- fixtures: the standard level on tiny models, built once --------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("modelhost-units")
    models_dir = folder / "models"
    build_all(models_dir)
    public = make_public(folder / "public")
    registry = Registry("standard", models_dir)
    ramp = np.linspace(-0.5, 0.5, 20000).astype("float32")  # 16 kHz: read as it is
    sf.write(public / "examples" / "ramp-16k.wav", ramp, 16000, subtype="FLOAT")
    low = (np.sin(np.arange(800) / 7.0) * 0.5).astype("float32")  # 8 kHz: resampled for a 16 kHz model
    sf.write(public / "examples" / "low-8k.wav", low, 8000, subtype="FLOAT")
    return types.SimpleNamespace(ramp=ramp, low=low, folder=folder, models_dir=models_dir, public=public, registry=registry,
                                 pool=ModelPool(registry, "cpu"))


def loaded(site, model_id: str) -> Loaded:
    with site.pool.use(site.registry.get(model_id)) as entry:
        return entry


class Spy:
    """A model's object, recorded: each call (and each call of a method named in `methods`) with its arguments
    and what the real object answered."""

    def __init__(self, real, methods: tuple[str, ...] = ()):
        self._real, self._methods, self.calls = real, methods, []

    def __call__(self, *args, **kwargs):
        seen = tuple(dict(a) if isinstance(a, dict) else a for a in args)  # a pipeline may empty a dict it is given
        out = self._real(*args, **kwargs)
        self.calls.append(("__call__", seen, kwargs, out))
        return out

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name not in self._methods:
            return attr

        def method(*args, **kwargs):
            out = attr(*args, **kwargs)
            self.calls.append((name, args, kwargs, out))
            return out

        return method


def spied(entry: Loaded, obj) -> Loaded:
    return dataclasses.replace(entry, obj=obj)


def stand_in(task: str, obj, loader: str = "pipeline") -> Loaded:
    return Loaded(spec=ModelSpec(id=f"test/{task}", task=task, loader=loader, level="minimal"), obj=obj,
                  device="cpu", nbytes=0, load_seconds=0.0)


def inputs(site, **body) -> Inputs:
    return Inputs(body=body, public_dir=site.public)


def public_file(site, out: dict) -> Path:
    return site.public / out["path"].lstrip("/")


def raises_bad(message: str):
    return pytest.raises(BadRequest, match="^" + re.escape(message) + "$")


# -- Inputs: the fields a client sends -----------------------------------------------------------------------------


def test_text_fields_are_required_non_empty_strings(site):
    assert inputs(site, text="hi").text() == "hi"
    assert inputs(site, text1="from text1").text() == "from text1"  # JARVIS's name for the first text
    assert inputs(site, text="a", text1="b").text() == "a"
    assert inputs(site, text2="second").text("text2") == "second"
    with raises_bad("`text2` is required and must be a non-empty string"):
        inputs(site, text1="only the first").text("text2")  # text1 stands in for `text` alone
    for bad in ({}, {"text": "   "}, {"text": 5}, {"text": ["a"]}, {"text": None, "text1": ""}):
        with raises_bad("`text` is required and must be a non-empty string"):
            Inputs(body=bad, public_dir=site.public).text()


def test_numbers_are_checked_against_their_range(site):
    assert inputs(site).number("x", 0.5, 0, 1) == 0.5
    for value in (0, 1, 0.25):
        got = inputs(site, x=value).number("x", 0.5, 0, 1)
        assert got == value and type(got) is float
    for value in (-0.01, 1.01, True, "0.5", [1], None, float("nan")):
        with pytest.raises(BadRequest, match=r"^`x` must be a number from 0 to 1, got "):
            inputs(site, x=value).number("x", 0.5, 0, 1)
    with raises_bad("`low` must be a number from 0 to 2000, got '2000.5'"):
        inputs(site, low=2000.5).number("low", 100, 0, 2000)
    with raises_bad(f"`x` must be a number from 0.5 to 1, got {'y' * 40!r}"):
        inputs(site, x="y" * 60).number("x", 0.7, 0.5, 1)


def test_whole_numbers_are_checked_against_their_range(site):
    assert inputs(site).integer("n", 7, 1, 10) == 7
    for value in (1, 10, 4):
        assert inputs(site, n=value).integer("n", 7, 1, 10) == value
    for value in (0, 11, 2.0, True, "5", None):
        with pytest.raises(BadRequest, match=r"^`n` must be a whole number from 1 to 10, got "):
            inputs(site, n=value).integer("n", 7, 1, 10)
    with raises_bad("`steps` must be a whole number from 1 to 150, got '151'"):
        inputs(site, steps=151).integer("steps", 20, 1, 150)
    with raises_bad(f"`n` must be a whole number from 1 to 10, got {'z' * 40!r}"):
        inputs(site, n="z" * 60).integer("n", 7, 1, 10)


def test_an_image_is_read_from_public_a_data_uri_and_refused_clearly(site):
    image = inputs(site, img_url="/examples/red.png").image()
    assert image.mode == "RGB" and image.size == (80, 60) and image.getpixel((0, 0)) == (200, 30, 30)
    data = base64.b64encode((site.public / "examples" / "green.jpg").read_bytes()).decode()
    assert inputs(site, img_url=f"data:image/jpeg;base64,{data}").image().size == (40, 40)
    for body in ({}, {"img_url": ""}, {"img_url": 5}, {"text": "/examples/red.png"}):
        with raises_bad("`img_url` is required: a public/ path, an http(s) URL or a data URI"):
            Inputs(body=body, public_dir=site.public).image()
    with pytest.raises(ResourceError, match=r"^`img_url` is not a readable image$"):
        inputs(site, img_url="/examples/hello.wav").image()
    with pytest.raises(ResourceError, match="outside public/"):
        inputs(site, img_url="../secret.txt").image()
    small = Inputs(body={"img_url": "/examples/red.png"}, public_dir=site.public, max_bytes=100)
    with pytest.raises(ResourceError, match="larger than the 0 MiB limit"):
        small.image()
    few = Inputs(body={"img_url": "/examples/red.png"}, public_dir=site.public, max_pixels=4799)
    with pytest.raises(ResourceError, match=r"^`img_url` is 80x60 pixels; at most 4,799 pixels are accepted$"):
        few.image()
    assert Inputs(body={"img_url": "/examples/red.png"}, public_dir=site.public, max_pixels=4800).image()


@pytest.fixture(scope="module")
def web(site):
    """An HTTP server on loopback serving public/examples, and a socket that accepts and never answers."""
    from flask import Flask, send_file

    from tests.fakes.llm_server import ThreadedServer

    app = Flask("files")

    @app.get("/<name>")
    def one(name):
        return send_file(site.public / "examples" / name)

    server = ThreadedServer(app).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    yield types.SimpleNamespace(url=server.url, silent=f"http://127.0.0.1:{silent.getsockname()[1]}/x.png",
                                policy=UrlPolicy.from_entries(["127.0.0.1"]))
    server.stop()
    silent.close()


def test_urls_are_fetched_under_the_servers_policy_and_timeout(site, web):
    def body(**kw):
        return Inputs(body=kw, public_dir=site.public, policy=web.policy, timeout=0.5)

    assert body(img_url=f"{web.url}/red.png").image().size == (80, 60)
    assert len(body(audio_url=f"{web.url}/hello.wav").audio()) == 8000
    with pytest.raises(ResourceError):  # the default policy refuses loopback addresses
        Inputs(body={"img_url": f"{web.url}/red.png"}, public_dir=site.public).image()
    with pytest.raises(ResourceError):
        Inputs(body={"audio_url": f"{web.url}/hello.wav"}, public_dir=site.public).audio()
    for field, reader in (("img_url", Inputs.image), ("audio_url", Inputs.audio)):
        started = time.monotonic()
        with pytest.raises(ResourceError):
            reader(body(**{field: web.silent}))
        assert time.monotonic() - started < 5


def test_fetch_urls_reads_each_url_once_and_keeps_a_failure_for_the_handler_that_reads_it(site, web):
    """LocalEngine.infer calls `fetch_urls` on the request's own thread before the model's turn: the handler
    then reads the bytes fetched there; a URL that failed fails the handler that reads it and nothing else; a
    public/ path or data URI is read where it is used, as before."""
    Image.new("RGB", (30, 20)).save(site.public / "examples" / "later.png")
    inputs = Inputs(body={"img_url": f" {web.url}/later.png", "audio_url": web.silent.replace("http", "HTTP", 1),
                          "text": "hi"}, public_dir=site.public, policy=web.policy, timeout=0.5)
    started = time.monotonic()
    inputs.fetch_urls()  # the silent peer's failure is kept, not raised
    assert time.monotonic() - started < 5
    assert set(inputs.fetched) == {"img_url", "audio_url"}
    Image.new("RGB", (5, 5)).save(site.public / "examples" / "later.png")  # changed after the fetch
    assert inputs.image().size == (30, 20)
    assert inputs.text() == "hi"
    with pytest.raises(ResourceError):
        inputs.audio()
    with pytest.raises(BadRequest, match="`img_url` is required"):
        Inputs(body={"img_url": ""}, public_dir=site.public).image()
    uri = "data:image/png;base64," + base64.b64encode((site.public / "examples" / "red.png").read_bytes()).decode()
    for ref in ("/examples/red.png", uri):
        local = Inputs(body={"img_url": ref, "audio_url": "/examples/hello.wav"}, public_dir=site.public)
        local.fetch_urls()
        assert local.fetched == {}
        assert local.image().size == (80, 60) and len(local.audio()) == 8000


def write_wav(site, name: str, samples, rate: int, subtype: str = "FLOAT") -> str:
    sf.write(site.public / "examples" / name, np.asarray(samples, dtype="float32"), rate, subtype=subtype)
    return f"/examples/{name}"


def test_audio_is_read_as_float32_mono_at_the_models_rate(site):
    ramp, low = site.ramp, site.low
    same = inputs(site, audio_url="/examples/ramp-16k.wav").audio()
    assert same.dtype == np.float32 and same.shape == (20000,) and np.array_equal(same, ramp)  # 16 kHz by default
    stereo = np.stack([np.full(100, 0.5), np.full(100, -0.25)], axis=1)
    mono = inputs(site, audio_url=write_wav(site, "stereo.wav", stereo, 16000)).audio()
    assert mono.shape == (100,) and np.allclose(mono, 0.125)
    up = inputs(site, audio_url="/examples/low-8k.wav").audio(16000)
    want = np.interp(np.linspace(0, 799, 1600), np.arange(800), low).astype("float32")
    assert up.dtype == np.float32 and up.shape == (1600,) and np.array_equal(up, want)
    down = inputs(site, audio_url="/examples/low-8k.wav").audio(4000)
    assert down.shape == (400,) and down[0] == low[0] and down[-1] == low[-1]
    empty = inputs(site, audio_url=write_wav(site, "empty.wav", np.zeros(0), 8000)).audio(16000)
    assert empty.shape == (0,)
    for body in ({}, {"audio_url": ""}, {"audio_url": 3}, {"img_url": "/examples/hello.wav"}):
        with raises_bad("`audio_url` is required: a public/ path, an http(s) URL or a data URI"):
            Inputs(body=body, public_dir=site.public).audio()
    with raises_bad("`audio_url` is not a readable audio file (wav, flac, ogg)"):
        inputs(site, audio_url="/examples/red.png").audio()
    with pytest.raises(ResourceError, match="larger than"):
        Inputs(body={"audio_url": "/examples/hello.wav"}, public_dir=site.public, max_bytes=100).audio()


def test_files_are_written_under_public_and_named_by_their_public_path(site):
    img = Image.new("RGB", (7, 5), (1, 2, 3))
    out = inputs(site).save_image(img)
    assert list(out) == ["path"] and out["path"].startswith("/images/") and out["path"].endswith(".png")
    with Image.open(public_file(site, out)) as back:
        assert back.size == (7, 5) and back.getpixel((3, 2)) == (1, 2, 3)
    samples = np.array([[0.0, 0.5], [-0.5, 0.25]], dtype="float16")  # half precision, as a model on CUDA gives
    out = inputs(site).save_audio(samples, 22050.0)
    assert list(out) == ["path"] and out["path"].startswith("/audios/") and out["path"].endswith(".wav")
    data, rate = sf.read(public_file(site, out), dtype="float32")
    assert rate == 22050 and np.allclose(data, [0.0, 0.5, -0.5, 0.25], atol=1e-4)
    assert sf.info(public_file(site, out)).format == "WAV"


def test_plain_turns_model_outputs_into_json_values():
    picture = Image.new("RGB", (2, 2))
    got = h.plain({"score": np.float32(0.5), 3: (np.int64(2), np.array([1, 2])), "mask": picture,
                   "t": torch.tensor([[1.5]]), "n": torch.tensor(3), "s": "x", "none": None})
    assert got == {"score": 0.5, "3": [2, [1, 2]], "t": [[1.5]], "n": 3, "s": "x", "none": None}
    assert type(got["score"]) is float and type(got["3"][0]) is int and type(got["n"]) is int
    assert h.plain([{"a": np.float64(1.0)}]) == [{"a": 1.0}]
    plain_array = array.array("i", [1, 2])  # has tolist but no dtype: left alone
    assert h.plain(plain_array) is plain_array


# -- handlers on tiny real models ------------------------------------------------------------------------------------


def test_text_classification_and_tagging_call_the_pipeline_as_jarvis_did(site):
    cls = Spy(loaded(site, SST).obj)
    out = h.text_pipeline(spied(loaded(site, SST), cls), inputs(site, text="a great movie"))
    (_, args, kwargs, real), = cls.calls
    assert args == ("a great movie",) and kwargs == {} and out == h.plain(real)
    assert out[0]["label"] in ("POSITIVE", "NEGATIVE") and type(out[0]["score"]) is float
    ner = Spy(loaded(site, NER).obj)
    tags = h.token_classification(spied(loaded(site, NER), ner), inputs(site, text="anna lives in berlin"))
    (_, args, kwargs, real), = ner.calls
    assert args == ("anna lives in berlin",) and kwargs == {"aggregation_strategy": "simple"}
    assert tags == h.plain(real) and tags and all("entity_group" in t and type(t["score"]) is float for t in tags)


def test_text_generation_is_greedy_and_bounded(site):
    gen = Spy(loaded(site, GPT2).obj)
    entry = spied(loaded(site, GPT2), gen)
    out = h.text_generation(entry, inputs(site, text="the cat", max_new_tokens=3))
    (_, args, kwargs, real), = gen.calls
    assert args == ("the cat",) and kwargs == {"max_new_tokens": 3, "do_sample": False}
    assert out == {"generated text": real[0]["generated_text"]} and out["generated text"].startswith("the cat")
    assert h.text_generation(entry, inputs(site, text="the cat", max_new_tokens=3)) == out  # greedy: the same again
    h.text_generation(entry, inputs(site, text="the dog"))
    assert gen.calls[-1][2] == {"max_new_tokens": 40, "do_sample": False}
    h.text_generation(entry, inputs(site, text="a", max_new_tokens=1))
    assert gen.calls[-1][2]["max_new_tokens"] == 1
    for bad in (0, 1025, 2.0, "5"):
        with pytest.raises(BadRequest, match="^`max_new_tokens` must be a whole number from 1 to 1024, got"):
            h.text_generation(entry, inputs(site, text="x", max_new_tokens=bad))
    with raises_bad("`text` is required and must be a non-empty string"):
        h.text_generation(entry, inputs(site))


def test_seq2seq_generates_and_decodes_without_special_tokens(site):
    tokenizer, model = loaded(site, BART).obj
    tok, mod = Spy(tokenizer), Spy(model, ("generate",))
    entry = spied(loaded(site, BART), (tok, mod))
    out = h.seq2seq(entry, inputs(site, text="the cat sits on the mat", max_new_tokens=4))
    (_, args, kwargs, _), = tok.calls
    assert args == ("the cat sits on the mat",) and kwargs == {"return_tensors": "pt", "truncation": True}
    (_, args, kwargs, generated), = mod.calls
    assert set(kwargs) == {"input_ids", "attention_mask", "max_new_tokens"} and kwargs["max_new_tokens"] == 4
    assert isinstance(kwargs["input_ids"], torch.Tensor)
    assert out == {"generated text": tokenizer.decode(generated[0], skip_special_tokens=True)}
    assert "[CLS]" in tokenizer.decode(generated[0]) and "[CLS]" not in out["generated text"]
    h.seq2seq(entry, inputs(site, text="hello world"))
    assert mod.calls[-1][2]["max_new_tokens"] == 128
    h.seq2seq(entry, inputs(site, text="hello world", max_new_tokens=1))
    assert mod.calls[-1][2]["max_new_tokens"] == 1
    class WithoutTypes(Spy):  # a tokenizer that gives no token_type_ids (GPT-2, T5)
        def __call__(self, *args, **kwargs):
            batch = super().__call__(*args, **kwargs)
            del batch["token_type_ids"]
            return batch

    h.seq2seq(spied(entry, (WithoutTypes(tokenizer), mod)), inputs(site, text="hello world", max_new_tokens=1))
    assert set(mod.calls[-1][2]) == {"input_ids", "attention_mask", "max_new_tokens"}
    long = " ".join(["w1"] * 600)  # past the 128 positions: truncated, not a crash
    before, tokenizer.model_max_length = tokenizer.model_max_length, 64
    try:
        h.seq2seq(entry, inputs(site, text=long, max_new_tokens=1))
    finally:
        tokenizer.model_max_length = before
    assert mod.calls[-1][2]["input_ids"].shape[1] == 64
    with pytest.raises(BadRequest, match="^`max_new_tokens` must be a whole number from 1 to 1024"):
        h.seq2seq(entry, inputs(site, text="x", max_new_tokens=1025))
    with pytest.raises(BadRequest, match="^`max_new_tokens`"):
        h.seq2seq(entry, inputs(site, text="x", max_new_tokens=0))


class Logits:
    """An extractive-QA model whose logits the test chooses: start and end scores by token position."""

    device = torch.device("meta")  # where the handler must send the inputs (a GPU, on a GPU box)

    def __init__(self, start: dict[int, float], end: dict[int, float]):
        self.start, self.end = start, end

    def __call__(self, input_ids, **_):
        assert input_ids.device == self.device
        n = self.length = input_ids.shape[1]
        start, end = torch.zeros(1, n), torch.zeros(1, n)
        for k, v in self.start.items():
            start[0, k] = v
        for k, v in self.end.items():
            end[0, k] = v
        return types.SimpleNamespace(start_logits=start, end_logits=end)


def answer_with(site, question: str, context: str, start: dict, end: dict) -> tuple[dict, list, list]:
    tokenizer = loaded(site, SQUAD).obj[0]
    enc = tokenizer(question, context, return_offsets_mapping=True)
    ctx = [k for k, s in enumerate(enc.sequence_ids(0)) if s == 1]
    out = h.question_answering(stand_in("question-answering", (tokenizer, Logits(start, end)), "extractive-qa"),
                               inputs(site, text=question, context=context))
    return out, ctx, enc["offset_mapping"]


def test_question_answering_picks_the_best_span_inside_the_context(site):
    context = "anna lives in berlin . the cat sits on the mat"
    _, ctx, offsets = answer_with(site, "who lives in berlin ?", context, {}, {})
    first = ctx[0]
    # a question token scores highest of all, but answers come from the context; the best sum of a start and an
    # end at or after it is first+1 .. first+5 (4 + 7); the best start alone (first+6) has no good end after it
    starts = {1: 50.0, first + 1: 4.0, first + 3: 3.0, first + 6: 9.0}
    ends = {1: 50.0, first + 5: 7.0, first + 2: 1.0, first + 4: 2.0}
    out, ctx, offsets = answer_with(site, "who lives in berlin ?", context, starts, ends)
    assert (out["start"], out["end"]) == (offsets[first + 1][0], offsets[first + 5][1])
    assert out["answer"] == context[out["start"]:out["end"]] == "lives in berlin . the"
    start, end = torch.zeros(len(ctx)), torch.zeros(len(ctx))
    for table, vector in ((starts, start), (ends, end)):
        for k, v in table.items():
            if k in ctx:
                vector[ctx.index(k)] = v
    want = float(torch.softmax(start, 0)[1] * torch.softmax(end, 0)[5])
    assert out["score"] == pytest.approx(want, rel=1e-6) and list(out) == ["answer", "score", "start", "end"]
    assert type(out["score"]) is float and type(out["start"]) is int
    # one token can win alone (start == end); of equal spans, the earliest
    out, ctx, _ = answer_with(site, "who ?", context, {}, {})
    assert out["answer"] == "anna"
    first = ctx[0]
    out, *_ = answer_with(site, "who ?", context, {first + 2: 3.0, first: 2.9}, {first + 2: 3.0, first + 4: -3.0})
    assert out["answer"] == "in"
    # a sum, not a difference: 1 + 5 beats 2 + 0.5 (and 2 - 0 would beat 1 - 5)
    out, *_ = answer_with(site, "who ?", context, {first + 2: 1.0, first + 4: 2.0}, {first + 2: 5.0, first + 4: 0.5})
    assert out["answer"] == "in"


def test_question_answering_spans_are_at_most_30_tokens(site):
    context = " ".join(["the"] * 40)
    _, ctx, offsets = answer_with(site, "who ?", context, {}, {})
    first = ctx[0]
    out, *_ = answer_with(site, "who ?", context, {first: 10.0}, {first + 30: 10.0, first + 29: 9.0})
    assert (out["start"], out["end"]) == (offsets[first][0], offsets[first + 29][1])
    assert out["answer"] == " ".join(["the"] * 30)


def test_question_answering_truncates_a_long_passage(site):
    tokenizer = loaded(site, SQUAD).obj[0]
    model = Logits({}, {})
    before, tokenizer.model_max_length = tokenizer.model_max_length, 16
    try:
        out = h.question_answering(stand_in("question-answering", (tokenizer, model), "extractive-qa"),
                                   inputs(site, text="who ?", context=" ".join(["the cat"] * 40)))
    finally:
        tokenizer.model_max_length = before
    assert model.length == 16 and out["answer"] in ("the", "cat")


def test_question_answering_on_the_tiny_model_and_its_refusals(site):
    entry = loaded(site, SQUAD)
    context = "the cat sits on the mat in berlin"
    out = h.question_answering(entry, inputs(site, text="where is the cat ?", context=context))
    assert out["answer"] and context[out["start"]:out["end"]] == out["answer"] and 0 < out["score"] <= 1
    for bad in ({}, {"context": ""}, {"context": 5}):
        with raises_bad("`context` is required for question-answering: the passage to answer from"):
            h.question_answering(entry, Inputs(body={"text": "who?", **bad}, public_dir=site.public))


def test_sentence_similarity_is_the_cosine_of_normalised_embeddings(site):
    entry = loaded(site, MINILM)
    enc = Spy(entry.obj, ("encode",))
    out = h.sentence_similarity(spied(entry, enc), inputs(site, text="A man plays a guitar.", text2="Stocks fell."))
    (_, args, kwargs, emb), = enc.calls
    assert args == (["A man plays a guitar.", "Stocks fell."],)
    assert kwargs == {"normalize_embeddings": True, "show_progress_bar": False}
    raw = entry.obj.encode(["A man plays a guitar.", "Stocks fell."])
    cos = float(np.dot(raw[0], raw[1]) / (np.linalg.norm(raw[0]) * np.linalg.norm(raw[1])))
    assert out == {"score": pytest.approx(cos, abs=1e-5)} and type(out["score"]) is float
    with raises_bad("`text2` is required and must be a non-empty string"):
        h.sentence_similarity(entry, inputs(site, text="a"))


VECTORS = {"a": [[1.0, 0.0, 0.0], [3.0, 2.0, 0.0]], "b": [[0.0, 4.0, 0.0], [0.0, 0.0, 2.0], [1.0, 1.0, 1.0]]}


def features(text):
    """A feature-extraction pipeline: one list of token vectors per text."""
    return [np.array(VECTORS[text])]


def test_sentence_similarity_on_a_feature_extractor_mean_pools_tokens(site):
    out = h.sentence_similarity(stand_in("sentence-similarity", features), inputs(site, text="a", text2="b"))
    a, b = np.array([2.0, 1.0, 0.0]), np.array([1 / 3, 5 / 3, 1.0])
    assert out == {"score": pytest.approx(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))}
    assert type(out["score"]) is float


def test_image_classification_and_detection(site):
    vit = Spy(loaded(site, VIT).obj)
    out = h.image_pipeline(spied(loaded(site, VIT), vit), inputs(site, img_url="/examples/red.png"))
    (_, args, kwargs, real), = vit.calls
    assert args[0].size == (80, 60) and kwargs == {} and out == h.plain(real)
    assert {x["label"] for x in out} <= {"tabby cat", "golden retriever", "rocket"}
    yolo = Spy(loaded(site, "hustvl/yolos-tiny").obj)
    entry = spied(loaded(site, "hustvl/yolos-tiny"), yolo)
    boxes = h.object_detection(entry, inputs(site, img_url="/examples/red.png", threshold=0))
    (_, args, kwargs, real), = yolo.calls
    assert args[0].size == (80, 60) and kwargs == {"threshold": 0.0} and type(kwargs["threshold"]) is float
    assert boxes == h.plain(real) and boxes and all(x["label"] in ("cat", "dog") for x in boxes)
    h.object_detection(entry, inputs(site, img_url="/examples/red.png"))
    assert yolo.calls[-1][2] == {"threshold": 0.5}
    h.object_detection(entry, inputs(site, img_url="/examples/red.png", threshold=1))
    assert yolo.calls[-1][2] == {"threshold": 1.0}
    for bad in (-0.1, 1.5, "0.5", None):
        with raises_bad("`threshold` must be a number between 0 and 1"):
            h.object_detection(entry, inputs(site, img_url="/examples/red.png", threshold=bad))
    with raises_bad("`img_url` is required: a public/ path, an http(s) URL or a data URI"):
        h.image_pipeline(loaded(site, VIT), inputs(site))


def test_segmentation_lists_segments_and_tints_the_input(site):
    mask = Image.new("L", (80, 60), 0)
    mask.paste(255, (0, 0, 40, 60))

    def segmenter(image):
        assert image.size == (80, 60)
        return [{"label": "cat", "score": np.float32(0.75), "mask": mask}, {"label": "sky", "score": None,
                                                                            "mask": Image.new("L", (80, 60), 0)}]

    out = h.image_segmentation(stand_in("image-segmentation", segmenter), inputs(site, img_url="/examples/red.png"))
    assert out["predicted"] == [{"label": "cat", "score": 0.75}, {"label": "sky", "score": None}]
    assert type(out["predicted"][0]["score"]) is float and out["path"].startswith("/images/")
    with Image.open(public_file(site, out)) as img:
        assert img.size == (80, 60) and img.getpixel((60, 30)) == (200, 30, 30)  # no mask there
        assert img.getpixel((10, 30)) != (200, 30, 30)
    real = h.image_segmentation(loaded(site, "nvidia/segformer-b0-finetuned-ade-512-512"),
                                inputs(site, img_url="/examples/red.png"))
    assert real["predicted"] and {p["label"] for p in real["predicted"]} <= {"sky", "tree", "road"}


def test_depth_estimation_writes_a_grey_map_of_the_input_size(site):
    out = h.depth_estimation(loaded(site, "Intel/dpt-large"), inputs(site, img_url="/examples/red.png"))
    assert list(out) == ["path"]
    with Image.open(public_file(site, out)) as img:
        assert img.size == (80, 60) and img.mode == "L"


def test_image_to_text_captions_without_special_tokens(site):
    processor, tokenizer, model = loaded(site, "nlpconnect/vit-gpt2-image-captioning").obj
    proc, mod = Spy(processor), Spy(model, ("generate",))
    entry = spied(loaded(site, "nlpconnect/vit-gpt2-image-captioning"), (proc, tokenizer, mod))
    out = h.image_to_text(entry, inputs(site, img_url="/examples/green.jpg"))
    (_, args, kwargs, _), = proc.calls
    assert args == () and kwargs["return_tensors"] == "pt" and kwargs["images"].size == (40, 40)
    (_, args, kwargs, generated), = mod.calls
    assert set(kwargs) == {"pixel_values", "max_new_tokens"} and kwargs["max_new_tokens"] == 30
    assert out == {"generated text": tokenizer.batch_decode(generated, skip_special_tokens=True)[0].strip()}
    assert "[CLS]" in tokenizer.batch_decode(generated)[0] and "[CLS]" not in out["generated text"]
    assert h.BATCHABLE["image-to-text"].run(entry, [Image.open(site.public / "examples" / "green.jpg").convert("RGB"),
                                                    h.decode_image((site.public / "examples" / "red.png").read_bytes())]
                                            )[0] == out
    assert mod.calls[-1][2]["max_new_tokens"] == 30 and mod.calls[-1][2]["pixel_values"].shape[0] == 2


def wide_vqa():
    """A ViLT answering among seven labels (more than the five answers a client gets)."""
    from transformers import ViltConfig, ViltForQuestionAnswering

    from tests.tiny_models import WORDS

    torch.manual_seed(1)
    labels = ["yes", "no", "one", "two", "red", "blue", "cat"]
    return labels, ViltForQuestionAnswering(ViltConfig(
        vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
        image_size=32, patch_size=8, max_position_embeddings=40, num_labels=len(labels),
        id2label=dict(enumerate(labels)), label2id={v: k for k, v in enumerate(labels)})).eval()


def test_visual_qa_answers_the_top_five_labels_with_probabilities(site):
    processor, model = loaded(site, "dandelin/vilt-b32-finetuned-vqa").obj
    proc = Spy(processor)
    out = h.visual_qa(spied(loaded(site, "dandelin/vilt-b32-finetuned-vqa"), (proc, model)),
                      inputs(site, img_url="/examples/red.png", text="what is red"))
    (_, args, kwargs, _), = proc.calls
    assert args[0].size == (80, 60) and args[1] == "what is red" and kwargs == {"return_tensors": "pt"}
    assert [a["answer"] for a in out] and {a["answer"] for a in out} == set(VQA_ANSWERS)  # four labels: all four
    assert sum(a["score"] for a in out) == pytest.approx(1.0)
    assert [a["score"] for a in out] == sorted((a["score"] for a in out), reverse=True)
    labels, wide = wide_vqa()
    answers = h.visual_qa(stand_in("visual-question-answering", (processor, wide)),
                          inputs(site, img_url="/examples/red.png", text="what is red"))
    enc = processor(Image.open(site.public / "examples" / "red.png").convert("RGB"), "what is red",
                    return_tensors="pt")
    with torch.inference_mode():
        probs = torch.softmax(wide(**enc).logits[0], -1)
    top = torch.topk(probs, 5)
    assert answers == [{"answer": labels[int(k)], "score": pytest.approx(float(v))}
                       for v, k in zip(top.values, top.indices, strict=True)]
    assert all(type(a["score"]) is float and type(a["answer"]) is str for a in answers)
    with raises_bad("`text` is required and must be a non-empty string"):
        h.visual_qa(loaded(site, "dandelin/vilt-b32-finetuned-vqa"), inputs(site, img_url="/examples/red.png"))


def test_document_qa_passes_word_boxes_and_explains_missing_ocr(site):
    words = [["anna", [0, 0, 100.7, 100]], ["lives", (110, 0, 200, 100)]]
    seen = []

    def reader(image, question, **kwargs):
        seen.append((image.size, question, kwargs))
        return [{"answer": "anna", "score": np.float32(0.5), "start": 0, "end": 0}]

    entry = stand_in("document-question-answering", reader)
    out = h.document_qa(entry, inputs(site, img_url="/examples/red.png", text="who", word_boxes=words))
    assert out == [{"answer": "anna", "score": 0.5, "start": 0, "end": 0}] and type(out[0]["score"]) is float
    assert seen[-1] == ((80, 60), "who", {"word_boxes": [("anna", [0, 0, 100, 100]), ("lives", [110, 0, 200, 100])]})
    h.document_qa(entry, inputs(site, img_url="/examples/red.png", text="who"))
    assert seen[-1] == ((80, 60), "who", {})
    for bad in ([1], "anna", [["anna", [0, 0, 1]]], [["anna", [0, 0, 1, 2], 3]], [[5, [0, 0, 1, 2]]],
                [["anna", "0 0 1 2"]], [["anna"]], {"anna": [0, 0, 1, 2]}):
        with raises_bad("`word_boxes` must be a list of [word, [x0, y0, x1, y1]] (boxes on a 0-1000 scale)"):
            h.document_qa(entry, inputs(site, img_url="/examples/red.png", text="who", word_boxes=bad))
    assert h.document_qa(entry, inputs(site, img_url="/examples/red.png", text="who", word_boxes=[])) == out
    assert seen[-1][2] == {"word_boxes": []}

    for error in (ValueError("If you provide an image without word_boxes, then the pipeline will run OCR using "
                             "Tesseract, but pytesseract is not available"),  # transformers, without pytesseract
                  OSError("tesseract is not installed or it's not in your PATH. See README file for more "
                          "information."),  # pytesseract's TesseractNotFoundError, without the binary
                  ValueError("No module named pytesseract"), ValueError("Tesseract could not read the page")):
        def no_ocr(image, question, error=error, **kwargs):
            raise error

        with raises_bad("document question answering needs OCR on the models server (apt-get install "
                        "tesseract-ocr; pip install pytesseract) or `word_boxes` in the request"):
            h.document_qa(stand_in("document-question-answering", no_ocr),
                          inputs(site, img_url="/examples/red.png", text="who"))

    def broken(image, question, **kwargs):
        raise ValueError("shapes do not match")

    with pytest.raises(ValueError, match="^shapes do not match$"):
        h.document_qa(stand_in("document-question-answering", broken),
                      inputs(site, img_url="/examples/red.png", text="who"))

    def no_disk(image, question, **kwargs):
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="^No space left on device$"):
        h.document_qa(stand_in("document-question-answering", no_disk), inputs(site, img_url="/examples/red.png",
                                                                                text="who"))
    real = h.document_qa(loaded(site, "impira/layoutlm-document-qa"),
                         inputs(site, img_url="/examples/red.png", text="who", word_boxes=words))
    assert real and set(real[0]["answer"].split()) <= {"anna", "lives"}


class Diffuser:
    """A diffusers pipeline stand-in: records its call, answers one image (or video frames) of a known colour."""

    def __init__(self, frames: bool = False):
        self.calls, self.frames = [], frames

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.frames:
            return types.SimpleNamespace(frames=[[np.full((16, 16, 3), 0.5, dtype="float32")] * 3])
        return types.SimpleNamespace(images=[Image.new("RGB", (12, 8), (9, 99, 199)), Image.new("RGB", (1, 1))])


def written_colour(site, out) -> tuple:
    with Image.open(public_file(site, out)) as img:
        return img.size, img.getpixel((0, 0))


def test_diffusion_handlers_pass_prompt_image_and_steps(site):
    for handler, task, default in ((h.text_to_image, "text-to-image", 25),
                                   (h.controlnet_generation, "canny-text-to-image", 20),
                                   (h.image_to_image, "image-to-image", 20)):
        pipe = Diffuser()
        entry = stand_in(task, pipe, "diffusers")
        out = handler(entry, inputs(site, text="a red fox", img_url="/examples/red.png"))
        assert list(out) == ["path"] and out["path"].startswith("/images/")
        assert written_colour(site, out) == ((12, 8), (9, 99, 199))
        (args, kwargs), = pipe.calls
        assert args == ("a red fox",) and kwargs["num_inference_steps"] == default, task
        assert set(kwargs) == ({"num_inference_steps"} if task == "text-to-image" else {"image", "num_inference_steps"})
        if "image" in kwargs:
            assert kwargs["image"].size == (80, 60)
        for steps in (1, 150):
            handler(entry, inputs(site, text="a red fox", img_url="/examples/red.png", steps=steps))
            assert pipe.calls[-1][1]["num_inference_steps"] == steps
        for steps in (0, 151, 2.0):
            with raises_bad(f"`steps` must be a whole number from 1 to 150, got {str(steps)!r}"):
                handler(entry, inputs(site, text="a red fox", img_url="/examples/red.png", steps=steps))
    pipe = Diffuser()
    h.image_to_image(stand_in("image-to-image", pipe), inputs(site, img_url="/examples/red.png"))
    assert pipe.calls[-1][0] == ("improve the image",)  # no instruction: JARVIS's default one
    h.image_to_image(stand_in("image-to-image", pipe), inputs(site, img_url="/examples/red.png", text=""))
    assert pipe.calls[-1][0] == ("improve the image",)
    with raises_bad("`text` is required and must be a non-empty string"):
        h.text_to_image(stand_in("text-to-image", pipe), inputs(site))


def test_text_to_video_writes_an_mp4_under_public_videos(site):
    pipe = Diffuser(frames=True)
    out = h.text_to_video(stand_in("text-to-video", pipe), inputs(site, text="a fox runs", steps=2))
    assert list(out) == ["path"] and out["path"].startswith("/videos/") and out["path"].endswith(".mp4")
    assert pipe.calls == [(("a fox runs",), {"num_inference_steps": 2})]
    import imageio.v3 as iio

    frames = iio.imread(public_file(site, out))
    assert frames.shape[0] == 3 and frames.shape[-1] == 3 and abs(int(frames[0, 8, 8, 0]) - 128) < 8
    h.text_to_video(stand_in("text-to-video", pipe), inputs(site, text="a fox runs"))
    assert pipe.calls[-1][1] == {"num_inference_steps": 25}
    h.text_to_video(stand_in("text-to-video", pipe), inputs(site, text="a fox runs", steps=1))  # a one-step preview
    assert pipe.calls[-1][1] == {"num_inference_steps": 1}
    with pytest.raises(BadRequest, match="^`steps` must be a whole number from 1 to"):
        h.text_to_video(stand_in("text-to-video", pipe), inputs(site, text="a fox runs", steps=0))


def test_sobel_matches_the_3x3_kernels_everywhere_but_the_border():
    impulse = np.zeros((5, 5), dtype="float32")
    impulse[2, 2] = 1
    gx, gy = h.sobel(impulse)
    assert gx.tolist() == [[0, 0, 0, 0, 0], [0, 1, 0, -1, 0], [0, 2, 0, -2, 0], [0, 1, 0, -1, 0], [0, 0, 0, 0, 0]]
    assert gy.tolist() == [[0, 0, 0, 0, 0], [0, 1, 2, 1, 0], [0, 0, 0, 0, 0], [0, -1, -2, -1, 0], [0, 0, 0, 0, 0]]
    gray = np.random.default_rng(3).uniform(0, 255, (6, 7)).astype("float32")
    kx = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]])
    want_x, want_y = np.zeros_like(gray), np.zeros_like(gray)
    for r in range(1, 5):
        for c in range(1, 6):
            patch = gray[r - 1:r + 2, c - 1:c + 2]
            want_x[r, c], want_y[r, c] = (patch * kx).sum(), (patch * kx.T).sum()
    gx, gy = h.sobel(gray)
    assert np.allclose(gx, want_x, atol=1e-3) and np.allclose(gy, want_y, atol=1e-3)


def test_canny_control_marks_strong_and_weak_edges(site):
    img = Image.new("L", (9, 9), 0)
    img.putpixel((2, 2), 100)  # Sobel magnitudes 200 beside it and 141 on its diagonals
    img.putpixel((6, 6), 50)  # ... and 100 beside this one, 71 on its diagonals
    img.convert("RGB").save(site.public / "examples" / "dots.png")

    def edges(**kw):
        out = h.canny_control(stand_in("canny-control", None, "annotator"),
                              inputs(site, img_url="/examples/dots.png", **kw))
        with Image.open(public_file(site, out)) as done:
            assert done.mode == "RGB" and done.size == (9, 9) and out["path"].startswith("/images/")
            return np.asarray(done)[..., 0]

    default = edges()  # low 100, high 200, both included
    assert default[2, 1] == 255 and default[1, 1] == 128 and default[6, 5] == 128 and default[5, 5] == 0
    assert default[2, 2] == 0 and default[0, 0] == 0 and default[8, 0] == 0
    assert set(np.unique(default).tolist()) == {0, 128, 255}
    gx, gy = h.sobel(np.asarray(img, dtype="float32"))
    mag = np.hypot(gx, gy)
    assert (edges(low_threshold=70, high_threshold=2000) == np.where(mag >= 70, 128, 0)).all()
    assert (edges(low_threshold=0, high_threshold=0) == 255).all()
    assert (edges(low_threshold=2000, high_threshold=2000) == 0).all()
    for field in ("low_threshold", "high_threshold"):
        with raises_bad(f"`{field}` must be a number from 0 to 2000, got '2001'"):
            edges(**{field: 2001})
    red = Image.new("RGB", (9, 9), (0, 0, 0))
    red.putpixel((2, 2), (255, 0, 0))  # luminance 76: edges of 152 beside it, weak at the default thresholds
    red.save(site.public / "examples" / "red-dot.png")
    out = h.canny_control(stand_in("canny-control", None, "annotator"), inputs(site, img_url="/examples/red-dot.png"))
    with Image.open(public_file(site, out)) as done:
        assert (np.asarray(done)[2, 1] == [128, 128, 128]).all()  # edges of the brightness, not of each channel


def test_normals_from_depth_are_exact_on_a_ramp():
    depth = np.tile(np.arange(11, dtype="float32"), (5, 1))  # 0..10 across: `near` is 0, 0.1, ... 1.0
    rgb = h.normals_from_depth(depth)
    x, z = 8.0, 2 * np.pi
    n = math.hypot(x, z)
    slope = [np.uint8(x / n * 127.5 + 127.5), 127, np.uint8(z / n * 127.5 + 127.5)]
    assert rgb.dtype == np.uint8 and rgb.shape == (5, 11, 3)
    assert (rgb[1:-1, 4:10] == slope).all()  # from `near` 0.4 on (its threshold included)
    assert (rgb[1:-1, 1:4] == [127, 127, 255]).all()  # nearer the back: background, facing the viewer
    assert (rgb[0] == [127, 127, 255]).all() and (rgb[:, 10] == [127, 127, 255]).all()  # the border
    assert (h.normals_from_depth(depth, 0.75)[1:-1, 4:8] == [127, 127, 255]).all()
    unit = h.normals_from_depth(depth / 10)  # a range under 1 is still a range
    assert (unit[1:-1, 4:10] == [np.uint8(0.8 / math.hypot(0.8, z) * 127.5 + 127.5), 127,
                                 np.uint8(z / math.hypot(0.8, z) * 127.5 + 127.5)]).all()
    steep = h.normals_from_depth(np.tile(np.arange(11, 0, -1, dtype="float32") * 1000, (5, 1)))
    assert steep[2, 2].tolist() == [0, 127, 127]  # x = -8000: the normal lies flat, pointing left
    column = h.normals_from_depth(depth.T.copy())  # the slope down the rows tilts green, not red
    assert (column[4:10, 1:-1] == [127, slope[0], slope[2]]).all()
    assert (h.normals_from_depth(np.full((4, 4), 7.0)) == [127, 127, 255]).all()
    assert (h.normals_from_depth(depth + 100) == rgb).all()  # the range counts from the map's own nearest-back
    assert (h.normals_from_depth(depth.astype("uint8")) == rgb).all()  # as a grey image gives it


def test_normal_control_resizes_the_depth_to_the_input(site):
    calls = []

    def depth_model(image):
        calls.append(image.size)
        return {"depth": Image.fromarray(np.tile(np.arange(0, 220, 20, dtype="uint8"), (5, 1)))}  # 11 x 5

    out = h.normal_control(stand_in("normal-control", depth_model, "depth-normals"),
                           inputs(site, img_url="/examples/red.png"))
    assert calls == [(80, 60)]
    with Image.open(public_file(site, out)) as img:
        assert img.size == (80, 60) and img.mode == "RGB"
        pixels = np.asarray(img)
    assert (pixels[30, 70] != [127, 127, 255]).any() and (pixels[30, 5] == [127, 127, 255]).all()
    flat = h.normal_control(stand_in("normal-control", depth_model, "depth-normals"),
                            inputs(site, img_url="/examples/red.png", bg_threshold=1.5))
    with Image.open(public_file(site, flat)) as img:
        assert (np.asarray(img) == [127, 127, 255]).all()
    in_colour = h.normal_control(stand_in("normal-control", lambda image: {"depth": depth_model(image)["depth"].convert("RGB")},
                                          "depth-normals"), inputs(site, img_url="/examples/red.png"))
    with Image.open(public_file(site, in_colour)) as img:
        assert (np.asarray(img) == pixels).all()  # a depth map given in RGB reads as its grey


def test_aux_annotators_save_their_map_as_rgb(site):
    out = h.aux_annotator(stand_in("hed-control", lambda image: Image.new("L", image.size, 77), "controlnet-aux"),
                          inputs(site, img_url="/examples/red.png"))
    with Image.open(public_file(site, out)) as img:
        assert img.mode == "RGB" and img.size == (80, 60) and img.getpixel((1, 1)) == (77, 77, 77)


def test_the_rate_a_pipeline_reads_audio_at():
    assert h._rate_of(types.SimpleNamespace(feature_extractor=types.SimpleNamespace(sampling_rate=22050))) == 22050
    assert h._rate_of(types.SimpleNamespace(feature_extractor=types.SimpleNamespace(sampling_rate=None))) == 16000
    assert h._rate_of(types.SimpleNamespace(feature_extractor=types.SimpleNamespace())) == 16000
    assert h._rate_of(object()) == 16000
    assert h._rate_of(object(), 8000) == 8000
    assert type(h._rate_of(types.SimpleNamespace(feature_extractor=types.SimpleNamespace(sampling_rate=8e3)))) is int


class OnAnotherDevice:
    """A generating model on a device that is not the CPU, as on a GPU box: records where its inputs were and
    answers `out` (on the CPU, as `.cpu()` or a decode would leave it)."""

    device = torch.device("meta")

    def __init__(self, out):
        self.out, self.devices = out, set()

    def generate(self, *args, **kwargs):
        self.devices |= {v.device.type for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)}
        return self.out

    generate_speech = generate


def test_inputs_go_to_the_models_device(site):
    tokenizer, _ = loaded(site, BART).obj
    ids = tokenizer("a cat", return_tensors="pt")["input_ids"]
    model = OnAnotherDevice(ids)
    out = h.seq2seq(spied(loaded(site, BART), (tokenizer, model)), inputs(site, text="the cat sits"))
    assert out == {"generated text": tokenizer.decode(ids[0], skip_special_tokens=True)} and model.devices == {"meta"}

    processor, captioner, _ = loaded(site, "nlpconnect/vit-gpt2-image-captioning").obj
    ids = torch.tensor([[5, 6, 7]])
    caption = {"generated text": captioner.decode(ids[0], skip_special_tokens=True).strip()}
    entry = spied(loaded(site, "nlpconnect/vit-gpt2-image-captioning"), (processor, captioner, model := OnAnotherDevice(ids)))
    assert h.image_to_text(entry, inputs(site, img_url="/examples/red.png")) == caption
    assert model.devices == {"meta"}
    model = OnAnotherDevice(ids.repeat(2, 1))
    entry = spied(entry, (processor, captioner, model))
    assert h._captions(entry, [inputs(site, img_url="/examples/red.png").image()] * 2) == [caption] * 2
    assert model.devices == {"meta"}

    def features(audio, sampling_rate, return_tensors):
        return {"input_values": torch.tensor(audio)[None]}

    model = OnAnotherDevice(torch.zeros(1600))
    speaker = torch.zeros(1, 512, device="meta")
    out = h.audio_to_audio(stand_in("audio-to-audio", (features, model, None, speaker), "speecht5-vc"),
                           inputs(site, audio_url="/examples/low-8k.wav"))
    assert model.devices == {"meta"} and list(out) == ["path"]


def test_speech_and_audio_classification_hear_the_file_at_the_models_rate(site):
    asr = Spy(loaded(site, "facebook/wav2vec2-base-960h").obj)
    out = h.speech_recognition(spied(loaded(site, "facebook/wav2vec2-base-960h"), asr),
                               inputs(site, audio_url="/examples/low-8k.wav"))
    (_, args, kwargs, real), = asr.calls
    assert kwargs == {} and set(args[0]) == {"raw", "sampling_rate"} and args[0]["sampling_rate"] == 16000
    assert args[0]["raw"].shape == (1600,) and out == {"text": real["text"].strip()}
    ast = Spy(loaded(site, "MIT/ast-finetuned-audioset-10-10-0.4593").obj)
    labels = h.audio_classification(spied(loaded(site, "MIT/ast-finetuned-audioset-10-10-0.4593"), ast),
                                    inputs(site, audio_url="/examples/low-8k.wav"))
    (_, args, kwargs, real), = ast.calls
    assert args[0]["sampling_rate"] == 16000 and args[0]["raw"].shape == (1600,) and labels == h.plain(real)
    assert {x["label"] for x in labels} == set(AUDIO_LABELS) and all(type(x["score"]) is float for x in labels)

    heard = []

    def shouting(payload):
        heard.append((payload["sampling_rate"], len(payload["raw"])))
        return {"text": "  HELLO  "}

    def labelling(payload):
        heard.append((payload["sampling_rate"], len(payload["raw"])))
        return [{"label": "speech", "score": 1.0}]

    shouting.feature_extractor = labelling.feature_extractor = types.SimpleNamespace(sampling_rate=8000)
    assert h.speech_recognition(stand_in("automatic-speech-recognition", shouting),
                                inputs(site, audio_url="/examples/low-8k.wav")) == {"text": "HELLO"}
    assert h.audio_classification(stand_in("audio-classification", labelling),
                                  inputs(site, audio_url="/examples/low-8k.wav")) == [{"label": "speech", "score": 1.0}]
    assert heard == [(8000, 800), (8000, 800)]  # each model's own rate, not 16 kHz


def test_text_to_speech_writes_the_models_audio_at_its_rate(site):
    tts = Spy(loaded(site, "facebook/mms-tts-eng").obj)
    out = h.text_to_speech(spied(loaded(site, "facebook/mms-tts-eng"), tts), inputs(site, text="hello world"))
    (_, args, kwargs, real), = tts.calls
    assert args == ("hello world",) and kwargs == {}
    data, rate = sf.read(public_file(site, out), dtype="float32")
    assert rate == real["sampling_rate"] == 16000 and data.shape == (np.asarray(real["audio"]).size,)
    assert out["path"].startswith("/audios/")


def test_audio_to_audio_pipelines_and_voice_conversion(site):
    def pipe_answering(answer):
        def pipe(payload):
            pipe.seen = payload
            return answer
        pipe.feature_extractor = types.SimpleNamespace(sampling_rate=8000)
        return pipe

    wave = np.linspace(-0.5, 0.5, 50).astype("float32")
    for answer, rate in (([{"audio": wave, "sampling_rate": 24000}], 24000), ({"blob": wave}, 8000),
                         ({"audio": wave, "blob": np.zeros(3)}, 8000)):
        pipe = pipe_answering(answer)
        out = h.audio_to_audio(stand_in("audio-to-audio", pipe), inputs(site, audio_url="/examples/low-8k.wav"))
        assert pipe.seen["sampling_rate"] == 8000 and np.array_equal(pipe.seen["raw"],
                                                                     inputs(site, audio_url="/examples/low-8k.wav")
                                                                     .audio(8000))
        data, got = sf.read(public_file(site, out), dtype="float32")
        assert got == rate and np.allclose(data, wave, atol=1e-4), answer

    calls = {}

    class Model:
        device = torch.device("cpu")

        def generate_speech(self, values, speaker, vocoder=None):
            calls["generate"] = (values, speaker, vocoder)
            return torch.full((40,), 0.25, dtype=torch.float64)

    def extract(audio=None, sampling_rate=None, return_tensors=None):
        calls["features"] = (audio, sampling_rate, return_tensors)
        return {"input_values": torch.ones(1, len(audio))}

    vocoder, speaker = object(), torch.zeros(1, 8)
    entry = Loaded(spec=ModelSpec(id="microsoft/speecht5_vc", task="audio-to-audio", loader="speecht5-vc",
                                  level="full"), obj=(extract, Model(), vocoder, speaker), device="cpu", nbytes=0,
                   load_seconds=0.0)
    out = h.audio_to_audio(entry, inputs(site, audio_url="/examples/ramp-16k.wav"))
    audio, rate, kind = calls["features"]
    assert rate == 16000 and kind == "pt" and audio.shape == (20000,)
    values, given_speaker, given_vocoder = calls["generate"]
    assert values.shape == (1, 20000) and given_speaker is speaker and given_vocoder is vocoder
    data, got = sf.read(public_file(site, out), dtype="float32")
    assert got == 16000 and data.shape == (40,) and np.allclose(data, 0.25, atol=1e-4)


# -- batches: one call for many requests, each answer as the handler gives it alone -----------------------------------


def test_a_batch_answers_each_input_as_the_handler_would_alone(site):
    entry = loaded(site, SST)
    spy = Spy(entry.obj)
    texts = ["a great movie", "a bad movie", "the cat"]
    together = h.BATCHABLE["text-classification"].run(spied(entry, spy), texts)
    assert [c[2] for c in spy.calls] == [{"batch_size": 3}]
    alone = [h.text_pipeline(entry, inputs(site, text=t)) for t in texts]
    assert len(together) == 3 and all(a[0]["label"] == b[0]["label"] and
                                       a[0]["score"] == pytest.approx(b[0]["score"], abs=1e-4)
                                       for a, b in zip(together, alone, strict=True))
    one = h.BATCHABLE["text-classification"].run(spied(entry, spy), ["a great movie"])
    assert spy.calls[-1][1:3] == (("a great movie",), {}) and one == [alone[0]]
    tags = h.BATCHABLE["token-classification"].run(loaded(site, NER), ["anna lives in berlin", "the red fox"])
    assert len(tags) == 2 and tags[0] == h.token_classification(loaded(site, NER), inputs(site, text="anna lives in berlin"))
    spy2 = Spy(loaded(site, NER).obj)
    h.BATCHABLE["token-classification"].run(spied(loaded(site, NER), spy2), ["anna", "berlin"])
    assert spy2.calls[-1][2] == {"batch_size": 2, "aggregation_strategy": "simple"}
    h.BATCHABLE["token-classification"].run(spied(loaded(site, NER), spy2), ["anna"])
    assert spy2.calls[-1][2] == {"aggregation_strategy": "simple"}
    red = h.decode_image((site.public / "examples" / "red.png").read_bytes())
    green = h.decode_image((site.public / "examples" / "green.jpg").read_bytes())
    pics = h.BATCHABLE["image-classification"].run(loaded(site, VIT), [red, green])
    assert [p[0]["label"] for p in pics] == [h.image_pipeline(loaded(site, VIT), inputs(site, img_url=u))[0]["label"]
                                            for u in ("/examples/red.png", "/examples/green.jpg")]
    assert len(pics[0]) == len(h.image_pipeline(loaded(site, VIT), inputs(site, img_url="/examples/red.png")))
    assert h.BATCHABLE["text-classification"].prepare(inputs(site, text1="x")) == "x"
    assert h.BATCHABLE["sentence-similarity"].prepare(inputs(site, text="a", text2="b")) == ("a", "b")
    assert h.BATCHABLE["image-classification"].prepare(inputs(site, img_url="/examples/red.png")).size == (80, 60)


def test_a_pipeline_that_answers_too_few_outputs_is_an_error():
    short = stand_in("text-classification", lambda texts, **kw: [{"label": "x", "score": 1.0}])
    with pytest.raises(RuntimeError, match=r"^the pipeline gave 1 outputs for 2 inputs$"):
        h.BATCHABLE["text-classification"].run(short, ["a", "b"])
    top2 = stand_in("text-classification", lambda texts, **kw: [[{"label": t, "score": np.float32(1)}] * 2
                                                                  for t in texts])
    assert h.BATCHABLE["text-classification"].run(top2, ["a", "b"]) == [[{"label": "a", "score": 1.0}] * 2,
                                                                        [{"label": "b", "score": 1.0}] * 2]


def test_similarity_batches_encode_once_and_match_the_handler(site):
    entry = loaded(site, MINILM)
    enc = Spy(entry.obj, ("encode",))
    pairs = [("A man plays a guitar.", "Someone plays guitar."), ("A cat.", "Stocks fell.")]
    got = h.BATCHABLE["sentence-similarity"].run(spied(entry, enc), pairs)
    (_, args, kwargs, _), = enc.calls
    assert args == ([t for p in pairs for t in p],)
    assert kwargs == {"normalize_embeddings": True, "show_progress_bar": False, "batch_size": 4}
    alone = [h.sentence_similarity(entry, inputs(site, text=a, text2=b)) for a, b in pairs]
    assert [g["score"] for g in got] == pytest.approx([a["score"] for a in alone], abs=1e-5)
    assert got[0]["score"] != pytest.approx(got[1]["score"], abs=1e-3)
    pooled = h.BATCHABLE["sentence-similarity"].run(stand_in("sentence-similarity", features), [("a", "b"), ("b", "a")])
    one = h.sentence_similarity(stand_in("sentence-similarity", features), inputs(site, text="a", text2="b"))
    assert pooled == [one, one]


# -- what no handler can use, and dispatch ------------------------------------------------------------------------


def nest(levels: int):
    value = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_check_body_refuses_lone_surrogates_and_deep_nesting():
    h.check_body({"text": "fine ✓", "n": 3, "list": [{"a": None}], "a": nest(31)})
    with raises_bad("`a` is nested more than 32 levels deep"):
        h.check_body({"a": nest(32)})
    with raises_bad("`a` is nested more than 32 levels deep"):
        h.check_body({"a": [{"b": nest(31)}]})
    with raises_bad("the body is nested more than 32 levels deep"):
        h.check_body(nest(33))
    h.check_body(nest(32))
    with raises_bad("`text` contains invalid Unicode (a lone surrogate at position 2)"):
        h.check_body({"ok": "y", "text": "ab\ud800"})
    with raises_bad("`list` contains invalid Unicode (a lone surrogate at position 0)"):
        h.check_body({"list": [{"deep": "\udfff"}]})
    with raises_bad("the body contains invalid Unicode (a lone surrogate at position 1)"):
        h.check_body({"k\ud800": 1})
    with raises_bad("the body contains invalid Unicode (a lone surrogate at position 0)"):
        h.check_body(["\ud800"])
    with raises_bad("`a` contains invalid Unicode (a lone surrogate at position 0)"):
        h.check_body({"a": {"\ud800": 1}})


def test_handle_dispatches_by_task_and_refuses_unknown_ones(site):
    assert h.handle("text-classification", loaded(site, SST), inputs(site, text="good"))[0]["label"] in (
        "POSITIVE", "NEGATIVE")
    with raises_bad("no handler for task picture-to-poem"):
        h.handle("picture-to-poem", loaded(site, SST), inputs(site, text="good"))
    assert set(h.BATCHABLE) <= set(h.HANDLERS)


# -- the Flask app ----------------------------------------------------------------------------------------------------


class Engine:
    """An engine whose `infer` the test scripts: a result, or an exception to raise."""

    def __init__(self, registry, outcome=None, loaded=None, device="cuda:0", batch=None):
        self.registry, self.outcome, self.device, self.batch = registry, outcome, device, batch
        self._loaded = loaded or {}
        self.calls = []

    def loaded(self):
        return dict(self._loaded)

    def infer(self, spec, inputs):
        self.calls.append((spec, inputs))
        if self.batch is not None:
            batch_size_var.set(self.batch)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def error_of(resp) -> dict:
    body = resp.get_json()
    assert list(body) == ["error"], body
    return body["error"]


@pytest.fixture(scope="module")
def app_site(site):
    app = create_app(LocalEngine(site.pool), site.public)
    return types.SimpleNamespace(app=app, client=app.test_client())


def test_running_status_and_models_on_the_real_pool(site, app_site):
    client = app_site.client
    resp = client.get("/running")
    assert resp.get_json() == {"running": True} and resp.headers["X-Content-Type-Options"] == "nosniff"
    loaded(site, NER)
    assert client.get(f"/status/{NER}").get_json() == {"loaded": True, "in_memory": True}
    assert client.get("/status/facebook/bart-large-cnn").get_json() == {"loaded": False, "in_memory": False}
    assert client.get("/status/nobody/nothing").get_json() == {"loaded": False, "in_memory": False}
    assert client.get(f"/status/{FULL_ONLY}").get_json() == {"loaded": False, "in_memory": False}
    listing = client.get("/models").get_json()
    assert listing["deployment"] == "standard" and listing["discovered_models"] == "off"
    assert listing["memory"]["models_bytes"] == sum(e.nbytes for e in site.pool.loaded().values())
    rows = {r["id"]: r for r in listing["models"]}
    assert FULL_ONLY not in rows
    ner = rows[NER]
    assert ner["task"] == "token-classification" and ner["servable"] is True and ner["problem"] is None
    assert ner["loaded"] is True and ner["device"] == "cpu" and ner["dtype"] == "float32"
    assert ner["weights_device"] == "cpu" and ner["device_memory_mb"] is None
    assert ner["memory_mb"] == round(site.pool.loaded()[NER].nbytes / 1e6, 1)
    bart = rows["facebook/bart-large-cnn"]
    assert bart["servable"] is False and "weights for facebook/bart-large-cnn" in bart["problem"]
    assert bart["loaded"] is False and bart["memory_mb"] is None and "dtype" not in bart


def test_models_rows_say_what_a_loaded_model_runs_in(site):
    spec = site.registry.get(NER)
    cuda = Loaded(spec=spec, obj=None, device="cuda:0", nbytes=2_345_678, load_seconds=1.0, dtype="torch.float16",
                  weights_device="cuda:0", device_bytes=1_000_123_456)
    bare = types.SimpleNamespace(nbytes=123_456_789_000)  # another engine's entry: the size alone
    engine = Engine(site.registry, loaded={NER: cuda, SST: bare})
    rows = {r["id"]: r for r in create_app(engine, site.public).test_client().get("/models").get_json()["models"]}
    assert {k: rows[NER][k] for k in ("loaded", "device", "memory_mb", "dtype", "weights_device",
                                      "device_memory_mb")} == {
        "loaded": True, "device": "cuda:0", "memory_mb": 2.3, "dtype": "torch.float16", "weights_device": "cuda:0",
        "device_memory_mb": 1000.123}
    assert {k: rows[SST][k] for k in ("memory_mb", "dtype", "weights_device", "device_memory_mb")} == {
        "memory_mb": 123456.8, "dtype": None, "weights_device": None, "device_memory_mb": None}
    assert "memory" not in create_app(engine, site.public).test_client().get("/models").get_json()


def test_inference_maps_each_failure_to_its_status(site, caplog):
    cases = [(BadRequest("`text` is required"), 400, "`text` is required", None),
             (ResourceError("`img_url` is not a readable image"), 400, "`img_url` is not a readable image", None),
             (ModelUnavailable("weights are missing"), 404, "weights are missing", None),
             (NoRoom("no room for it"), 503, "no room for it", "no_room"),
             (InferenceFailed("CUDA error"), 500, f"{NER} failed: CUDA error", None),
             (KeyError("depth"), 500, f"{NER} failed: KeyError: 'depth'", None),
             (RuntimeError("x" * 400), 500, f"{NER} failed: RuntimeError: {'x' * 300}", None)]
    for exc, status, message, kind in cases:
        client = create_app(Engine(site.registry, exc), site.public).test_client()
        resp = client.post(f"/models/{NER}", json={"text": "anna"})
        assert resp.status_code == status and error_of(resp) == {"message": message, **({"type": kind} if kind else {})}
        assert resp.headers.get("Retry-After") == ("5" if status == 503 else None)
        text = client.get("/metrics").get_data(as_text=True)
        assert f'models_server_calls_total{{model="{NER}",outcome="error"}} 1.0' in text
        seconds = float(re.search(rf'models_server_call_seconds_sum{{model="{re.escape(NER)}"}} (\S+)', text).group(1))
        assert 0 <= seconds < 60  # the call's own time
    unexpected = [r for r in caplog.records if r.name == "hugginggpt.modelhost.app"]
    assert [r.getMessage() for r in unexpected] == [f"inference with {NER} failed"] * 2  # KeyError, RuntimeError
    assert [r.exc_info[0] for r in unexpected] == [KeyError, RuntimeError]


def test_inference_answers_the_result_and_the_batch_size(site):
    engine = Engine(site.registry, [{"label": "B-PER", "score": 0.5}], batch=3)
    app = create_app(engine, site.public, policy=UrlPolicy.from_entries(["10.0.0.0/8"]), max_pixels=1234)
    client = app.test_client()
    resp = client.post(f"/models/{NER}", json={"text": "anna", "extra": [1, {"k": None}]})
    assert resp.status_code == 200 and resp.get_json() == [{"label": "B-PER", "score": 0.5}]
    assert resp.headers["X-Batch-Size"] == "3"
    spec, given = engine.calls[-1]
    assert spec is site.registry.get(NER) and given.body == {"text": "anna", "extra": [1, {"k": None}]}
    assert given.public_dir == site.public and given.max_pixels == 1234 and given.policy.allow_networks
    engine.batch = None
    assert "X-Batch-Size" not in client.post(f"/models/{NER}", json={"text": "anna"}).headers
    text = client.get("/metrics").get_data(as_text=True)
    assert f'models_server_calls_total{{model="{NER}",outcome="ok"}} 2.0' in text
    assert "models_server_models_loaded 0.0" in text


def test_bodies_no_handler_can_use_are_refused_before_any_model_runs(site):
    engine = Engine(site.registry, {"ok": True})
    client = create_app(engine, site.public, max_body_bytes=2000).test_client()
    for body, message in (([1, 2], "the body must be a JSON object such as {\"text\": ...} or {\"img_url\": ...}"),
                          ("text", "the body must be a JSON object such as {\"text\": ...} or {\"img_url\": ...}"),
                          ({"text": "a\ud800"}, "`text` contains invalid Unicode (a lone surrogate at position 1)"),
                          ({"a": nest(40)}, "`a` is nested more than 32 levels deep")):
        resp = client.post(f"/models/{NER}", json=body)
        assert resp.status_code == 400 and error_of(resp) == {"message": message}, body
    resp = client.post(f"/models/{NER}", data="{oops", content_type="application/json")
    assert resp.status_code == 400 and "JSON object" in error_of(resp)["message"]
    deep = "[" * 5000 + "]" * 5000
    resp = client.post(f"/models/{NER}", data='{"a": ' + deep[:1900] + "}", content_type="application/json")
    assert resp.status_code == 400 and error_of(resp) == {"message": "the body is nested more than 32 levels deep"}
    resp = client.post(f"/models/{NER}", data='{"text": "' + "x" * 2100 + '"}', content_type="application/json")
    assert resp.status_code == 413 and "message" in error_of(resp)
    assert engine.calls == []
    resp = client.post("/models/nobody/nothing", json={"text": "x"})
    assert resp.status_code == 404 and error_of(resp)["message"] == (
        "unknown model 'nobody/nothing' at deployment level 'standard'; see GET /models")
    resp = client.post("/models/facebook/bart-large-cnn", json={"text": "x"})
    assert resp.status_code == 404 and error_of(resp)["message"].startswith("weights for facebook/bart-large-cnn")
    assert engine.calls == []


def test_the_body_limit_and_the_early_token_check(site):
    default = create_app(Engine(site.registry), site.public)
    assert default.config["MAX_CONTENT_LENGTH"] == 50 * 1024 * 1024
    gate = default.extensions[BODY_GATE]
    assert gate.max_body_bytes == 50 * 1024 * 1024 and gate.too_large() == Refusal(
        413, f"request body is larger than {50 * 1024 * 1024} bytes", None)
    assert gate.judge("POST", "/models/x", headers_of({}), 10) is None
    small = create_app(Engine(site.registry), site.public, max_body_bytes=1000, token="s3cret")
    gate = small.extensions[BODY_GATE]
    assert gate.judge("POST", "/models/x", headers_of({"AUTHORIZATION": "Bearer s3cret"}), 1001) == gate.too_large()
    assert gate.judge("POST", "/models/x", headers_of({"AUTHORIZATION": "Bearer s3cret"}), 1000) is None
    assert gate.judge("POST", "/models/x", headers_of({"AUTHORIZATION": "Bearer nope"}), 10) == Refusal(
        401, "this models server needs `Authorization: Bearer <models_server_token>`", None)
    assert gate.judge("GET", "/running", headers_of({}), None).status == 401
    assert "static" not in {rule.endpoint for rule in small.url_map.iter_rules()}  # no files from the package


def test_a_token_guards_every_route_and_replaces_the_browser_checks(site):
    client = create_app(Engine(site.registry, {"ok": 1}), site.public, token="s3cret").test_client()
    resp = client.get("/running")
    assert resp.status_code == 401 and error_of(resp) == {
        "message": "this models server needs `Authorization: Bearer <models_server_token>`"}
    assert client.get("/running", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/examples/red.png").status_code == 401
    auth = {"Authorization": "Bearer s3cret", "Host": "gpu-box.example", "Origin": "https://evil.example"}
    assert client.get("/running", headers=auth).get_json() == {"running": True}
    resp = client.post(f"/models/{NER}", data='{"text": "x"}', headers={**auth, "Content-Type": "text/plain"})
    assert resp.status_code == 200 and resp.get_json() == {"ok": 1}


def test_without_a_token_the_host_origin_and_json_checks_hold(site):
    app = create_app(Engine(site.registry, {"ok": 1}), site.public, listen_host="My-Box.lan",
                     hosts=("gpu-box.internal",))
    client = app.test_client()
    for host in ("localhost:5000", "my-box.lan", "gpu-box.internal:80", "10.1.2.3", "[::1]:9"):
        assert client.get("/running", headers={"Host": host}).status_code == 200, host
    long = "evil" + "x" * 150 + ".example"
    for host in ("evil.example", long):
        resp = client.get("/running", headers={"Host": host})
        assert resp.status_code == 403 and error_of(resp) == {"message": (
            f"this models server does not answer to the host name {host[:100]!r}; add it to models_server_hosts in "
            "its config (or set models_server_token)")}
    resp = client.get("/running", headers={"Origin": "https://evil.example"})
    assert resp.status_code == 403 and error_of(resp) == {"message": (
        "requests from a web page on another site are refused by a models server without models_server_token")}
    for origin in ("http://localhost:3000", "http://gpu-box.internal:80"):
        assert client.get("/running", headers={"Origin": origin, "Host": "gpu-box.internal:80"}).status_code == 200
    resp = client.post(f"/models/{NER}", data='{"text": "x"}', content_type="text/plain")
    assert resp.status_code == 415 and error_of(resp) == {
        "message": "send the body as JSON with `Content-Type: application/json` (got text/plain)"}
    resp = client.post(f"/models/{NER}", data='{"text": "x"}')
    assert resp.status_code == 415 and error_of(resp)["message"].endswith("(got none)")
    odd = "application/" + "y" * 150
    resp = client.post(f"/models/{NER}", data="{}", content_type=odd)
    assert resp.status_code == 415 and error_of(resp)["message"].endswith(f"(got {odd[:100]})")
    assert client.post(f"/models/{NER}", json={"text": "x"}).get_json() == {"ok": 1}
    assert create_app(Engine(site.registry), site.public).test_client().get(
        "/running", headers={"Host": "my-box.lan"}).status_code == 403


def test_generated_files_are_served_and_nothing_else(site, app_site):
    out = inputs(site).save_image(Image.new("RGB", (3, 3), (5, 6, 7)))
    client = app_site.client
    resp = client.get(out["path"])
    assert resp.status_code == 200 and resp.mimetype == "image/png"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    with Image.open(io.BytesIO(resp.data)) as img:
        assert img.getpixel((1, 1)) == (5, 6, 7)
    for path in ("/images/nothing.png", "/examples/red.png", "/images/..%2F..%2Fsecret.txt", "/secret.txt"):
        resp = client.get(path)
        assert resp.status_code == 404 and "message" in error_of(resp), path
    resp = client.put("/running")
    assert resp.status_code == 405 and error_of(resp)["message"]
    assert sorted(resp.headers["Allow"].split(", ")) == ["GET", "HEAD", "OPTIONS"]  # HTTP's 405 names them


def test_an_unexpected_error_is_a_json_500_and_its_traceback_is_logged(site, caplog):
    class Broken(Engine):
        def loaded(self):
            raise ZeroDivisionError("boom")

    with caplog.at_level(logging.ERROR, logger="hugginggpt.modelhost.app"):
        resp = create_app(Broken(site.registry), site.public).test_client().get("/models")
    assert resp.status_code == 500 and error_of(resp) == {"message": "internal error (ZeroDivisionError)"}
    [record] = [r for r in caplog.records if r.name == "hugginggpt.modelhost.app"]
    assert record.getMessage() == "models server error" and record.exc_info[0] is ZeroDivisionError


def test_an_http_error_says_what_werkzeug_says_and_metrics_are_prometheus_text(site, app_site):
    from hugginggpt.modelhost.metrics import CONTENT_TYPE as PROMETHEUS

    resp = app_site.client.get("/no/such/route")
    assert resp.status_code == 404 and error_of(resp) == {"message": (
        "The requested URL was not found on the server. If you entered the URL manually please check your "
        "spelling and try again.")}
    resp = app_site.client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["Content-Type"] == PROMETHEUS


def test_discovered_ids_go_to_discovery_and_catalog_ids_never_do(site, tmp_path):
    discovery = Discovery(DiscoveryPolicy(mode="local", deny=("evil-org",)), tmp_path / "hub",
                          endpoint="http://127.0.0.1:9", curated_ids=site.registry.catalog_ids)
    folder = tmp_path / "hub" / "tiny-org" / "ner"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x")
    (folder / ".hugginggpt-discovered.json").write_text(
        '{"id": "tiny-org/ner", "task": "token-classification", "loader": "pipeline", '
        '"pipeline_task": "token-classification", "files": ["model.safetensors"]}')
    registry = Registry("standard", tmp_path / "hub")  # one models folder, as models_server.py gives both
    engine = Engine(registry, [{"entity_group": "PER"}])
    client = create_app(engine, site.public, discovery=discovery).test_client()
    assert client.get("/status/tiny-org/ner").get_json() == {"loaded": True, "loadable": True, "discovered": True,
                                                             "in_memory": False}
    refused = client.get("/status/evil-org/ner").get_json()
    assert refused["discovered"] is True and refused["kind"] == "author_denied" and refused["in_memory"] is False
    # catalog ids, at this level or another, are never the discovery path's
    assert client.get(f"/status/{NER}").get_json() == {"loaded": False, "in_memory": False}
    assert client.get(f"/status/{FULL_ONLY}").get_json() == {"loaded": False, "in_memory": False}
    resp = client.post(f"/models/{FULL_ONLY}", json={"text": "x"})
    assert resp.status_code == 404 and error_of(resp)["message"].startswith(f"unknown model {FULL_ONLY!r}")
    resp = client.post("/models/tiny-org/ner", json={"text": "anna"})
    assert resp.status_code == 200 and engine.calls[-1][0].id == "tiny-org/ner"
    assert engine.calls[-1][0].source == "hub"
    resp = client.post("/models/evil-org/ner", json={"text": "anna"})
    assert resp.status_code == 403 and error_of(resp)["type"] == "author_denied"
    assert "discovered_authors_deny" in error_of(resp)["message"]
    resp = client.post("/models/tiny-org/bad--name", json={"text": "anna"})
    assert resp.status_code == 400 and error_of(resp)["type"] == "bad_model_id"
    listing = client.get("/models").get_json()
    assert listing["discovered_models"] == "local"
    row = {r["id"]: r for r in listing["models"]}["tiny-org/ner"]
    assert row == {"id": "tiny-org/ner", "task": "token-classification", "servable": True, "problem": None,
                   "loaded": False, "device": "cuda:0", "discovered": True, "memory_mb": None}
    (tmp_path / "hub" / "evil-org" / "ner").mkdir(parents=True)
    for name in ("model.safetensors", ".hugginggpt-discovered.json"):
        (tmp_path / "hub" / "evil-org" / "ner" / name).write_bytes(
            (folder / name).read_bytes().replace(b"tiny-org", b"evil-org"))
    rows = {r["id"]: r for r in client.get("/models").get_json()["models"]}
    assert rows["evil-org/ner"]["servable"] is False and "discovered_authors_deny" in rows["evil-org/ner"]["problem"]
    engine._loaded["tiny-org/ner"] = types.SimpleNamespace(nbytes=2_345_678)  # now in memory
    rows = {r["id"]: r for r in client.get("/models").get_json()["models"]}
    assert {k: rows["tiny-org/ner"][k] for k in ("loaded", "memory_mb", "discovered")} == {
        "loaded": True, "memory_mb": 2.3, "discovered": True}
    with pytest.raises(DiscoveryRefused):
        discovery.check_policy("evil-org/ner")


def test_without_discovery_an_unknown_id_is_just_unknown(site):
    client = create_app(Engine(site.registry), site.public, discovery=None).test_client()
    assert client.get("/status/tiny-org/ner").get_json() == {"loaded": False, "in_memory": False}
    resp = client.post("/models/tiny-org/ner", json={"text": "x"})
    assert resp.status_code == 404 and "unknown model" in error_of(resp)["message"]
