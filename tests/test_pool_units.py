"""Edge cases of hugginggpt/modelhost/pool.py, each pinned where a user would notice it broken
(mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import logging
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import hugginggpt.modelhost.pool as pool_module
from hugginggpt.modelhost.pool import (
    HEADROOM,
    InferenceFailed,
    ModelPool,
    ModelUnavailable,
    NoRoom,
    amount,
    describe,
    is_out_of_memory,
    load,
    memory_of,
    torch_modules,
)
from hugginggpt.modelhost.registry import ModelSpec, Registry
from tests import tiny_models

MB = 1_000_000

# -- the helpers: what a model holds, in words and bytes -----------------------------------------------------------


def test_amounts_read_as_a_person_would_write_them():
    assert amount(2_345_000_000) == "2.3 GB"
    assert amount(1e9) == "1.0 GB"
    assert amount(1_050_000_000) == "1.1 GB"
    assert amount(1_500_000) == "2 MB"
    assert amount(1_500) == "2 kB"
    assert amount(999_999_999) == "1000 MB"
    assert amount(456_000_000) == "456 MB"
    assert amount(1e6) == "1 MB"
    assert amount(999_999) == "1000 kB"
    assert amount(89_000) == "89 kB"
    assert amount(0) == "0 kB"
    assert amount(-3_000_000_000) == "-3.0 GB"
    assert amount(-5_000_000) == "-5 MB"


class Holder:
    """A pipeline-like object that keeps its network under an attribute."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def test_the_networks_inside_a_pipeline_are_found_wherever_they_are_kept():
    a, b, c, d = (torch.nn.Linear(2, 2) for _ in range(4))
    assert torch_modules(a) == [a]
    assert torch_modules(None) == []
    assert torch_modules((None, a, [b])) == [a, b]
    assert torch_modules(Holder(model=a)) == [a]
    assert torch_modules(Holder(components={"unet": a, "vae": b, "scheduler": "ddim"})) == [a, b]
    assert torch_modules(Holder(_first_module=c)) == [c]
    assert torch_modules(Holder(model=a, components={"x": b}, _first_module=d)) == [a, b, d]
    assert torch_modules([a, a, Holder(model=a)]) == [a]  # one network, counted once
    cycle = Holder()
    cycle.model = cycle
    assert torch_modules(cycle) == []


def test_the_search_stops_three_levels_down():
    m = torch.nn.Linear(2, 2)
    assert torch_modules(Holder(model=Holder(model=Holder(model=m)))) == [m]  # depth 3
    assert torch_modules(Holder(model=Holder(model=Holder(model=Holder(model=m))))) == []  # depth 4
    assert torch_modules([[[m]]]) == [m]
    assert torch_modules([[[[m]]]]) == []
    assert torch_modules(Holder(model=Holder(model=Holder(components={"unet": m})))) == [m]  # a dict's values too
    assert torch_modules(Holder(model=Holder(model=Holder(model=Holder(components={"unet": m}))))) == []


class Broken(torch.nn.Module):
    def parameters(self, recurse: bool = True):
        raise RuntimeError("meta tensors")


def test_dtype_device_and_size_of_a_model():
    m = torch.nn.Linear(3, 2)  # 8 float32 parameters
    assert describe(Holder(model=m)) == ("float32", "cpu")
    assert describe(m.to(torch.float16)) == ("float16", "cpu")
    assert describe(None) == (None, None)
    assert describe(torch.nn.ReLU()) == (None, None)  # a network without parameters
    assert describe(Broken()) == (None, None)
    assert memory_of((torch.nn.Linear(3, 2), torch.nn.Linear(3, 2).to(torch.float16))) == 8 * 4 + 8 * 2
    assert memory_of(None) == 0
    assert memory_of(Broken()) == 0


def test_out_of_memory_is_recognised_by_type_or_by_message(monkeypatch):
    assert is_out_of_memory(torch.OutOfMemoryError("no room"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))
    oom = torch.OutOfMemoryError
    monkeypatch.delattr(torch, "OutOfMemoryError")  # an older torch: only torch.cuda has it
    assert is_out_of_memory(oom("no room"))
    monkeypatch.delattr(torch.cuda, "OutOfMemoryError")  # neither: the message alone
    assert not is_out_of_memory(oom("no room"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory"))
    monkeypatch.setattr(torch, "OutOfMemoryError", oom, raising=False)
    assert is_out_of_memory(oom("no room"))  # torch's own name, torch.cuda's absent


def test_without_torch_nothing_is_out_of_memory(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert is_out_of_memory(RuntimeError("CUDA out of memory")) is False


# -- load(): every loader on a tiny model saved here ----------------------------------------------------------------


def build_models(folder: Path) -> None:
    tiny_models.text_classifier(folder / "tiny/clf")
    tiny_models.depth_estimator(folder / "tiny/depth")
    tiny_models.seq2seq_lm(folder / "tiny/s2s")
    tiny_models.extractive_qa(folder / "tiny/qa")
    tiny_models.image_captioner(folder / "tiny/captioner")
    tiny_models.visual_qa(folder / "tiny/vqa")
    tiny_models.voice_converter(folder / "tiny/vc")
    tiny_models.voice_converter(folder / "tiny/vc-voice")
    np.save(folder / "tiny/vc-voice/speaker_embeddings.npy", np.full(8, 0.5, dtype=np.float64))
    tiny_models.hifigan_vocoder(folder / "tiny/hifigan")
    tiny_models.tiny_stable_diffusion(folder / "tiny/sd")
    tiny_models.tiny_controlnet(folder / "tiny/controlnet")


@pytest.fixture(scope="module")
def models_dir():
    return tiny_models.built_once("pool-units", build_models)


def spec(mid: str, task: str, loader: str, **extra) -> ModelSpec:
    return ModelSpec(mid, task, loader, "minimal", **extra)


def reg_of(models_dir, *specs: ModelSpec) -> Registry:
    return Registry("minimal", models_dir, specs)


def loaded(models_dir, s: ModelSpec, device: str = "cpu"):
    return load(s, reg_of(models_dir, s), device)


def test_an_annotator_loads_nothing(models_dir):
    assert loaded(models_dir, spec("tiny/annotator", "canny-control", "annotator", needs_weights=False)) is None


def test_missing_weights_are_refused_with_the_reason(models_dir):
    with pytest.raises(ModelUnavailable, match=r"weights for tiny/absent are not in local_models_dir/tiny/absent"):
        loaded(models_dir, spec("tiny/absent", "text-classification", "pipeline", pipeline_task="text-classification"))
    with pytest.raises(ModelUnavailable, match=r"^weights for tiny/unneeded are missing$"):
        loaded(models_dir, spec("tiny/unneeded", "text-classification", "pipeline", needs_weights=False))
    with pytest.raises(ModelUnavailable, match="plugs into tiny/nowhere"):
        loaded(models_dir, spec("tiny/controlnet", "canny-control", "controlnet", base_model="tiny/nowhere"))


def test_an_unknown_loader_is_named(models_dir):
    with pytest.raises(ValueError, match=r"unknown loader 'telepathy' for tiny/clf"):
        loaded(models_dir, spec("tiny/clf", "text-classification", "telepathy"))


def test_a_pipeline_runs_its_task(models_dir):
    pipe = loaded(models_dir, spec("tiny/clf", "text-classification", "pipeline", pipeline_task="text-classification"))
    assert pipe("a fine day")[0]["label"] in ("NEGATIVE", "POSITIVE")
    assert describe(pipe) == ("float32", "cpu")


def test_depth_normals_loads_a_depth_pipeline(models_dir):
    from PIL import Image

    pipe = loaded(models_dir, spec("tiny/depth", "normal-control", "depth-normals"))
    assert "depth" in pipe(Image.new("RGB", (32, 32), "red"))


def test_tokenizer_and_model_pairs_come_in_eval_mode(models_dir):
    tok, model = loaded(models_dir, spec("tiny/s2s", "summarization", "seq2seq"))
    assert type(model).__name__ == "BartForConditionalGeneration" and not model.training
    assert tok("the cat")["input_ids"]
    tok, model = loaded(models_dir, spec("tiny/qa", "question-answering", "extractive-qa"))
    assert type(model).__name__ == "BertForQuestionAnswering" and not model.training
    assert tok("the cat")["input_ids"]


def test_a_sentence_embedder_encodes(models_dir):
    model = loaded(models_dir, spec("tiny/clf", "sentence-similarity", "sentence-embedding"))
    assert model.encode(["the cat"]).shape == (1, 32)


def test_an_encoder_decoder_captioner_loads_its_three_parts(models_dir):
    proc, tok, model = loaded(models_dir, spec("tiny/captioner", "image-to-text", "vision2seq"))
    assert type(model).__name__ == "VisionEncoderDecoderModel" and not model.training
    assert tok("the cat")["input_ids"] and hasattr(proc, "preprocess")


def test_a_captioner_of_another_architecture_loads_through_its_processor(tmp_path):
    """BLIP and its kin are not VisionEncoderDecoder models: the processor serves as both halves."""
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipImageProcessor, BlipProcessor

    folder = tmp_path / "tiny/blip"
    tok = tiny_models.bert_tokenizer(folder)
    BlipProcessor(image_processor=BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=tok).save_pretrained(folder)
    config = BlipConfig(text_config={"vocab_size": len(tiny_models.WORDS), "hidden_size": 32, "num_hidden_layers": 1,
                                     "num_attention_heads": 2, "intermediate_size": 37, "encoder_hidden_size": 32},
                        vision_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                       "intermediate_size": 37, "image_size": 32, "patch_size": 8}, projection_dim=16)
    BlipForConditionalGeneration(config).save_pretrained(folder)
    proc, tok2, model = loaded(tmp_path, spec("tiny/blip", "image-to-text", "vision2seq"))
    assert proc is tok2 and type(proc).__name__ == "BlipProcessor"
    assert type(model).__name__ == "BlipForConditionalGeneration" and not model.training


def test_a_visual_question_answerer_loads_with_its_processor(models_dir):
    proc, model = loaded(models_dir, spec("tiny/vqa", "visual-question-answering", "vqa"))
    assert type(model).__name__ == "ViltForQuestionAnswering" and not model.training
    assert type(proc).__name__ == "ViltProcessor"


def test_voice_conversion_brings_its_vocoder_and_a_voice(models_dir):
    fe, model, vocoder, speaker = loaded(models_dir, spec("tiny/vc", "audio-to-audio", "speecht5-vc",
                                                         base_model="tiny/hifigan"))
    assert type(fe).__name__ == "SpeechT5FeatureExtractor"
    assert type(model).__name__ == "SpeechT5ForSpeechToSpeech" and not model.training
    assert type(vocoder).__name__ == "SpeechT5HifiGan" and not vocoder.training
    assert torch.equal(speaker, torch.zeros(1, 8))  # no voice saved: a neutral one
    *_, speaker = loaded(models_dir, spec("tiny/vc-voice", "audio-to-audio", "speecht5-vc", base_model="tiny/hifigan"))
    assert speaker.dtype == torch.float32 and torch.equal(speaker, torch.full((1, 8), 0.5))


def test_diffusion_pipelines_load_in_full_precision_on_the_cpu(models_dir):
    pipe = loaded(models_dir, spec("tiny/sd", "text-to-image", "diffusers"))
    assert type(pipe).__name__ == "StableDiffusionPipeline" and pipe.unet.dtype == torch.float32
    pipe = loaded(models_dir, spec("tiny/controlnet", "canny-control", "controlnet", base_model="tiny/sd"))
    assert type(pipe).__name__ == "StableDiffusionControlNetPipeline"
    assert pipe.controlnet.dtype == torch.float32 and pipe.unet.dtype == torch.float32


class Recorder:
    """Stands in for a from_pretrained / pipeline factory: records what it was asked, returns something movable."""

    def __init__(self):
        self.calls: list[tuple[tuple, dict]] = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self

    def to(self, device):
        self.calls.append((("to", device), {}))
        return self


def test_on_cuda_pipelines_load_in_half_precision_except_audio_and_depth(models_dir, monkeypatch):
    from transformers import pipeline  # noqa: F401 - its first use puts a new module in sys.modules: patch that one

    rec = Recorder()
    monkeypatch.setattr(sys.modules["transformers"], "pipeline", rec)
    loaded(models_dir, spec("tiny/clf", "text-classification", "pipeline", pipeline_task="text-classification"),
           "cuda:0")
    loaded(models_dir, spec("tiny/clf", "automatic-speech-recognition", "pipeline",
                            pipeline_task="automatic-speech-recognition"), "cuda:0")
    loaded(models_dir, spec("tiny/clf", "audio-classification", "pipeline", pipeline_task="audio-classification"),
           "cuda:0")
    loaded(models_dir, spec("tiny/clf", "depth-estimation", "pipeline", pipeline_task="depth-estimation"), "cuda:0")
    loaded(models_dir, spec("tiny/clf", "text-classification", "pipeline", pipeline_task="text-classification"), "cpu")
    where = str(models_dir / "tiny/clf")
    assert rec.calls == [(("text-classification",), {"model": where, "device": "cuda:0", "dtype": torch.float16}),
                         (("automatic-speech-recognition",), {"model": where, "device": "cuda:0"}),
                         (("audio-classification",), {"model": where, "device": "cuda:0"}),
                         (("depth-estimation",), {"model": where, "device": "cuda:0"}),
                         (("text-classification",), {"model": where, "device": "cpu"})]


def test_a_tiny_depth_model_in_half_precision_predicts_all_zeros_so_it_runs_in_float32(models_dir):
    """Why depth estimation stays in float32 on CUDA: the tiny DPT's depth is ~1e-9, below float16's smallest
    number, so in half precision the whole map is 0 and the pipeline's grey image (depth - min) / (max - min) is
    0 / 0: all black. (Run here on the CPU, whose float16 rounds the same way.)"""
    import warnings

    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8))
    where = str(models_dir / "tiny/depth")
    from transformers import pipeline

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the 0 / 0
        half = pipeline("depth-estimation", model=where, device="cpu", dtype=torch.float16)(image)
    assert half["predicted_depth"].abs().max() == 0 and np.asarray(half["depth"]).max() == 0
    s = spec("tiny/depth", "depth-estimation", "pipeline", pipeline_task="depth-estimation")
    pipe = loaded(models_dir, s)  # float32, as `load` gives it on CUDA too
    assert describe(pipe) == ("float32", "cpu") and np.asarray(pipe(image)["depth"]).max() == 255


def test_on_cuda_diffusion_pipelines_load_in_half_precision(models_dir, monkeypatch):
    import diffusers

    pipes, controlnets = Recorder(), Recorder()
    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained", pipes)
    monkeypatch.setattr(diffusers.ControlNetModel, "from_pretrained", controlnets)
    monkeypatch.setattr(diffusers.StableDiffusionControlNetPipeline, "from_pretrained", pipes)
    loaded(models_dir, spec("tiny/sd", "text-to-image", "diffusers"), "cuda:0")
    loaded(models_dir, spec("tiny/controlnet", "canny-control", "controlnet", base_model="tiny/sd"), "cuda:1")
    sd, cn = str(models_dir / "tiny/sd"), str(models_dir / "tiny/controlnet")
    assert pipes.calls == [((sd,), {"torch_dtype": torch.float16}), (("to", "cuda:0"), {}),
                           ((sd,), {"controlnet": controlnets, "torch_dtype": torch.float16}), (("to", "cuda:1"), {})]
    assert controlnets.calls == [((cn,), {"torch_dtype": torch.float16})]


def test_each_annotator_task_gets_its_own_detector(models_dir, monkeypatch):
    import types

    detectors = {name: Recorder() for name in ("HEDdetector", "MLSDdetector", "OpenposeDetector")}
    fake = types.ModuleType("controlnet_aux")
    for name, rec in detectors.items():
        setattr(fake, name, types.SimpleNamespace(from_pretrained=rec))
    monkeypatch.setitem(sys.modules, "controlnet_aux", fake)
    monkeypatch.setattr("hugginggpt.modelhost.registry.library_problem", lambda module: None)
    where = str(models_dir / "tiny/clf")
    for task, name in (("hed-control", "HEDdetector"), ("mlsd-control", "MLSDdetector"),
                       ("openpose-control", "OpenposeDetector")):
        s = spec("tiny/annotators", task, "controlnet-aux", weights_from="tiny/clf")
        assert loaded(models_dir, s, "cpu") is detectors[name]
        assert detectors[name].calls == [((where,), {}), (("to", "cpu"), {})]


# -- the pool, on fake models of known sizes -------------------------------------------------------------------------


class Weights(torch.nn.Module):
    """A 'model' whose parameters take `nbytes` (float32)."""

    def __init__(self, nbytes: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(nbytes // 4))


def sized_registry(folder, sizes: dict[str, int | None]) -> Registry:
    """Each model's weight file has its size on disk (None: no weight file, the size is unknown before loading)."""
    specs = []
    for mid, size in sizes.items():
        (folder / mid).mkdir(parents=True, exist_ok=True)
        if size is None:
            (folder / mid / "config.json").write_text("{}")
        else:
            (folder / mid / "model.safetensors").write_bytes(b"\0" * size)
        specs.append(ModelSpec(mid, "text-classification", "pipeline", "minimal", "text-classification"))
    return Registry("minimal", folder, tuple(specs))


class FakeLoads:
    """pool.load replaced: a model takes what its weight file says (or `actual[id]`); `fail` raises instead."""

    def __init__(self, monkeypatch, actual: dict[str, int] | None = None):
        self.calls: list[str] = []
        self.actual = actual or {}
        self.fail: BaseException | None = None
        monkeypatch.setattr(pool_module, "load", self)

    def __call__(self, spec, registry, device):
        self.calls.append(spec.id)
        if self.fail is not None:
            raise self.fail
        return Weights(self.actual.get(spec.id) or registry.expected_bytes(spec))


def use(pool: ModelPool, mid: str):
    with pool.use(pool.registry.get(mid)) as entry:
        return entry


def hold(pool: ModelPool, mid: str):
    """Keep `mid` in use from another thread until the returned event is set."""
    inside, release = threading.Event(), threading.Event()

    def run() -> None:
        with pool.use(pool.registry.get(mid)):
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert inside.wait(30)
    return release, thread


def test_a_loaded_entry_says_what_it_is_and_what_it_took(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB}), "cpu")
    before = time.perf_counter()
    entry = use(pool, "m/a")
    took = time.perf_counter() - before
    assert entry.spec.id == "m/a" and entry.device == "cpu" and isinstance(entry.obj, Weights)
    assert entry.nbytes == 2 * MB and entry.dtype == "float32" and entry.weights_device == "cpu"
    assert entry.device_bytes is None  # measured on CUDA only
    assert 0 <= entry.load_seconds <= took
    assert use(pool, "m/a") is entry and pool.loads == 1


def test_memory_counts_the_loaded_models_and_the_budget(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 3 * MB}), "cpu", budget_bytes=10 * MB)
    assert pool.memory()["models_bytes"] == 0 and pool.peak_bytes == 0 and pool.loads == 0
    use(pool, "m/a")
    use(pool, "m/b")
    report = pool.memory()
    assert report["models_bytes"] == 5 * MB and report["budget_bytes"] == 10 * MB
    assert "freed_on_eviction_bytes" not in report  # nothing evicted (and nothing measured) yet
    assert pool.peak_bytes == 5 * MB and pool.loads == 2


def test_loading_and_eviction_are_logged(tmp_path, monkeypatch, caplog):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 1_050_000, "m/b": 2 * MB}), "cpu", budget_bytes=3 * MB)
    with caplog.at_level(logging.INFO, logger=pool_module.__name__):
        use(pool, "m/a")
        use(pool, "m/b")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "loading m/a (text-classification) on cpu"
    assert lines[1].startswith("loaded m/a in ") and lines[1].endswith("s (1.1 MB, float32 on cpu)")  # 1.05 MB
    assert lines[2:4] == ["evicted m/a to make room", "loading m/b (text-classification) on cpu"]


def test_a_model_exactly_filling_the_budget_fits(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 3 * MB, "m/c": 1 * MB}), "cpu",
                     budget_bytes=5 * MB)
    use(pool, "m/a")
    use(pool, "m/b")
    assert pool.evictions == [] and set(pool.loaded()) == {"m/a", "m/b"}
    use(pool, "m/c")  # one byte over: the least recently used goes
    assert pool.evictions == ["m/a"] and set(pool.loaded()) == {"m/b", "m/c"}
    assert pool.peak_bytes == 5 * MB


def test_too_large_for_the_budget_says_how_large_and_what_is_left(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 3 * MB, "m/huge": 7 * MB}), "cpu",
                     budget_bytes=6 * MB)
    with pytest.raises(NoRoom) as err:
        use(pool, "m/huge")
    assert str(err.value) == "m/huge needs about 7 MB, more than memory_budget_gb allows (6 MB)"
    use(pool, "m/a")
    release, thread = hold(pool, "m/a")
    try:
        with pytest.raises(NoRoom) as err:
            use(pool, "m/huge")
        assert str(err.value) == ("m/huge needs about 7 MB and memory_budget_gb leaves 4 MB; in use now: m/a; try "
                                  "again when they finish")
    finally:
        release.set()
        thread.join(10)
    assert set(pool.loaded()) == {"m/a"} and pool.evictions == []


def test_every_model_in_use_is_named_oldest_first(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB, "m/c": 3 * MB}), "cpu",
                     budget_bytes=5 * MB)
    use(pool, "m/b")
    use(pool, "m/a")
    held = [hold(pool, "m/b"), hold(pool, "m/a")]
    try:
        with pytest.raises(NoRoom) as err:
            use(pool, "m/c")
        assert str(err.value).endswith("leaves 1 MB; in use now: m/b, m/a; try again when they finish")
    finally:
        for release, thread in held:
            release.set()
            thread.join(10)


def test_an_idle_model_over_the_budget_is_not_named_busy(tmp_path, monkeypatch):
    """Measured larger than its files said, the first model stays while in use; the refusal then names it."""
    FakeLoads(monkeypatch, actual={"m/a": 5 * MB})
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 1 * MB, "m/b": 1 * MB}), "cpu", budget_bytes=4 * MB)
    use(pool, "m/a")  # 5 MB measured over a 4 MB budget: nothing else to evict, it stays
    assert set(pool.loaded()) == {"m/a"}
    release, thread = hold(pool, "m/a")
    try:
        with pytest.raises(NoRoom) as err:
            use(pool, "m/b")
        assert str(err.value) == ("m/b needs about 1 MB and memory_budget_gb leaves 0 kB; in use now: m/a; try "
                                  "again when they finish")
    finally:
        release.set()
        thread.join(10)
    use(pool, "m/b")
    assert pool.evictions == ["m/a"]


def test_a_model_of_unknown_size_is_measured_after_loading_and_the_others_make_room(tmp_path, monkeypatch):
    FakeLoads(monkeypatch, actual={"m/new": 3 * MB})
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB, "m/new": None}), "cpu",
                     budget_bytes=6 * MB)
    use(pool, "m/a")
    use(pool, "m/b")
    use(pool, "m/a")
    use(pool, "m/new")  # 7 MB in all: the least recently used (b) goes, a stays
    assert pool.evictions == ["m/b"] and set(pool.loaded()) == {"m/a", "m/new"}
    assert pool.peak_bytes == 7 * MB


def test_without_a_budget_or_a_free_memory_reading_nothing_is_evicted(tmp_path, monkeypatch):
    FakeLoads(monkeypatch, actual={"m/b": 3 * MB})
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": None}))  # the defaults: the CPU, no budget
    assert use(pool, "m/a").device == "cpu"
    use(pool, "m/b")
    assert pool.evictions == [] and set(pool.loaded()) == {"m/a", "m/b"}


class Device:
    """Free memory as a device would report it: capacity less the pool's loaded models."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.pool: ModelPool | None = None
        self.readings = 0

    def free(self) -> int:
        self.readings += 1
        return self.capacity - sum(e.nbytes for e in self.pool.loaded().values())


def device_pool(folder, sizes, capacity: int, budget: int | None = None) -> tuple[ModelPool, Device]:
    device = Device(capacity)
    device.pool = ModelPool(sized_registry(folder, sizes), "cpu", budget_bytes=budget, free_memory=device.free)
    return device.pool, device


def test_the_device_must_have_the_weights_and_a_fifth_more_free(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    assert HEADROOM == 0.2
    pool, device = device_pool(tmp_path, {"m/a": 5 * MB, "m/b": 5 * MB}, capacity=11 * MB)
    use(pool, "m/a")
    use(pool, "m/b")  # 6 MB free, exactly the 5 MB and its headroom: a stays
    assert pool.evictions == [] and set(pool.loaded()) == {"m/a", "m/b"}
    pool, device = device_pool(tmp_path / "2", {"m/a": 5 * MB, "m/b": 5 * MB}, capacity=11 * MB - 1)
    use(pool, "m/a")
    use(pool, "m/b")  # one byte short: a goes
    assert pool.evictions == ["m/a"] and set(pool.loaded()) == {"m/b"}


def test_the_device_refusal_says_what_was_needed_and_what_was_free(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool, device = device_pool(tmp_path, {"m/a": 5 * MB, "m/b": 10 * MB}, capacity=11 * MB)
    use(pool, "m/a")
    with pytest.raises(NoRoom) as err:
        use(pool, "m/b")  # a goes, and still 12 MB do not fit in 11
    assert str(err.value) == "m/b needs about 12 MB on cpu (weights and room to run) and the device has 11 MB free"
    assert pool.evictions == ["m/a"] and pool.loaded() == {}


def test_the_device_and_the_budget_are_both_asked(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool, device = device_pool(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB, "m/c": 2 * MB}, capacity=100 * MB,
                               budget=10 * MB)
    use(pool, "m/a")
    use(pool, "m/b")
    assert device.readings == 2 and pool.evictions == []
    device.capacity = 5 * MB  # someone else took most of the device: the budget has room, the device not
    use(pool, "m/c")
    assert pool.evictions == ["m/a"] and set(pool.loaded()) == {"m/b", "m/c"}


def test_out_of_memory_while_loading_retries_once_after_evicting_the_idle(tmp_path, monkeypatch):
    loads = FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB, "m/c": 2 * MB}), "cpu")
    use(pool, "m/a")
    use(pool, "m/b")
    loads.fail = torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(NoRoom) as err:
        use(pool, "m/c")
    assert str(err.value) == "m/c does not fit in the memory of cpu (out of memory while loading)"
    assert loads.calls.count("m/c") == 2 and pool.evictions == ["m/a", "m/b"] and pool.loaded() == {}
    loads.calls.clear()
    with pytest.raises(NoRoom, match=r"^m/c does not fit"):
        use(pool, "m/c")  # nothing idle left to evict: no second try
    assert loads.calls == ["m/c"]


def test_a_load_is_tried_twice_at_most_even_when_a_model_has_become_idle_meanwhile(tmp_path, monkeypatch):
    loads = FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB, "m/c": 2 * MB}), "cpu")
    use(pool, "m/a")
    use(pool, "m/b")
    release, thread = hold(pool, "m/b")

    def load(spec, registry, device):
        loads.calls.append(spec.id)
        if loads.calls.count("m/c") == 2:  # b's request ends while c is tried again
            release.set()
            thread.join(10)
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(pool_module, "load", load)
    try:
        with pytest.raises(NoRoom) as err:
            use(pool, "m/c")
    finally:
        release.set()
        thread.join(10)
    assert str(err.value) == "m/c does not fit in the memory of cpu (out of memory while loading)"
    assert loads.calls.count("m/c") == 2 and pool.evictions == ["m/a"] and set(pool.loaded()) == {"m/b"}


def test_a_model_is_loaded_on_the_pool_s_device(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_module, "load", lambda spec, registry, device: Weights(2 * MB).to(device))
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB}), "meta")  # a device every machine has
    entry = use(pool, "m/a")
    assert (entry.device, entry.weights_device, entry.dtype, entry.nbytes) == ("meta", "meta", "float32", 2 * MB)


def test_an_ordinary_load_error_is_not_retried_and_evicts_nothing(tmp_path, monkeypatch):
    loads = FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB}), "cpu")
    use(pool, "m/a")
    loads.fail = OSError("config.json is not valid JSON")
    with pytest.raises(OSError, match="not valid JSON"):
        use(pool, "m/b")
    assert loads.calls == ["m/a", "m/b"] and pool.evictions == [] and set(pool.loaded()) == {"m/a"}


def test_errors_while_running_pass_through_and_out_of_memory_becomes_a_refusal(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB}), "cpu")
    s = pool.registry.get("m/a")
    with pytest.raises(InferenceFailed, match="bad input"):
        with pool.use(s):
            raise InferenceFailed("bad input")
    with pytest.raises(NoRoom) as err:
        with pool.use(s):
            raise RuntimeError("CUDA out of memory. Tried to allocate 8.00 GiB")
    assert str(err.value) == ("m/a ran out of memory on cpu while running this request; try again with a smaller "
                              "input or when other models are idle")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert set(pool.loaded()) == {"m/a"} and pool.loads == 1


def test_an_eviction_spares_a_model_in_use_or_already_gone(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB}), "cpu")
    assert pool._drop("m/a") is False  # noqa: SLF001 - never loaded
    use(pool, "m/a")
    release, thread = hold(pool, "m/a")
    try:
        assert pool._drop("m/a") is False  # noqa: SLF001
    finally:
        release.set()
        thread.join(10)
    assert pool.evictions == [] and set(pool.loaded()) == {"m/a"}
    assert pool._drop("m/a") is True and pool.evictions == ["m/a"]  # noqa: SLF001


def test_preload_loads_what_can_be_served_and_skips_the_rest(tmp_path, monkeypatch):
    loads = FakeLoads(monkeypatch)
    reg = sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB})
    missing = ModelSpec("m/missing", "text-classification", "pipeline", "minimal", "text-classification")
    pool = ModelPool(reg, "cpu")
    pool.preload([reg.get("m/a"), missing, reg.get("m/b")])
    assert loads.calls == ["m/a", "m/b"] and set(pool.loaded()) == {"m/a", "m/b"}


class FakeCuda:
    """torch.cuda's allocator counters for a pool on "cuda:0": what the fake models hold while referenced."""

    def __init__(self, monkeypatch):
        self.allocated = 0
        self.asked: list[str] = []
        self.emptied = 0
        monkeypatch.setattr(torch.cuda, "memory_allocated", self.memory_allocated)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)

    def memory_allocated(self, device):
        self.asked.append(device)
        return self.allocated

    def empty_cache(self):
        self.emptied += 1


def test_on_cuda_what_a_load_takes_and_an_eviction_gives_back_is_measured(tmp_path, monkeypatch, caplog):
    cuda = FakeCuda(monkeypatch)
    loads = FakeLoads(monkeypatch)
    real = loads.__call__

    def load(spec, registry, device):
        obj = real(spec, registry, device)
        cuda.allocated += 3 * MB
        return obj

    monkeypatch.setattr(pool_module, "load", load)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB}), "cuda:0", budget_bytes=3 * MB)
    cuda.allocated = 1 * MB
    assert use(pool, "m/a").device_bytes == 3 * MB
    assert set(cuda.asked) == {"cuda:0"} and cuda.emptied == 0

    def empty_cache():  # the evicted model's memory comes back when the cache is emptied
        cuda.emptied += 1
        cuda.allocated -= 2 * MB

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    with caplog.at_level(logging.INFO, logger=pool_module.__name__):
        use(pool, "m/b")
    assert pool.evictions == ["m/a"] and pool.freed == {"m/a": 2 * MB} and cuda.emptied == 1
    assert "evicted m/a to make room (2 MB back on cuda:0)" in [r.getMessage() for r in caplog.records]


def safetensors_registry(folder, floats: dict[str, int]) -> Registry:
    """Each model's weights a real float32 .safetensors file of `floats[id]` numbers (a text classifier)."""
    from safetensors.torch import save_file

    specs = []
    for mid, n in floats.items():
        (folder / mid).mkdir(parents=True, exist_ok=True)
        save_file({"w": torch.zeros(n)}, str(folder / mid / "model.safetensors"))
        specs.append(ModelSpec(mid, "text-classification", "pipeline", "minimal", "text-classification"))
    return Registry("minimal", folder, tuple(specs))


def half_on_cuda(spec, registry, device):
    """pool.load on CUDA for a text classifier: its float32 weights in float16 (load's `dtype`), half their size."""
    from safetensors.torch import load_file

    n = sum(t.numel() for f in registry.weights_path(spec).glob("*.safetensors") for t in load_file(str(f)).values())
    weights = Weights(4 * n)
    return weights.to(torch.float16) if device.startswith("cuda") else weights


def test_on_cuda_two_models_that_do_not_both_fit_in_half_precision_evict_each_other(tmp_path, monkeypatch):
    """The GPU check's case: two classifiers in turns under a budget of 1.5 times the larger as it runs (float16 on
    CUDA, float32 on the CPU): one model loaded at a time on both devices. The estimate before a load is in the
    dtype the model loads in, so the second model is not refused for its float32 size on disk."""
    FakeCuda(monkeypatch)
    monkeypatch.setattr(pool_module, "load", half_on_cuda)
    for device in ("cpu", "cuda:0"):
        registry = safetensors_registry(tmp_path / device, {"m/a": 23_000, "m/b": 21_000})  # 92 kB and 84 kB
        sizes = [pool_module.expected_size(registry.get(m), registry, device) for m in ("m/a", "m/b")]
        took = {"m/a": 92_000, "m/b": 84_000} if device == "cpu" else {"m/a": 46_000, "m/b": 42_000}
        assert sizes == ([92_072, 84_072] if device == "cpu" else [46_000, 42_000])  # the file, or its numbers at 2
        pool = ModelPool(registry, device, budget_bytes=int(1.5 * max(sizes)))
        held = []
        for mid in ("m/a", "m/b", "m/a", "m/b"):
            assert use(pool, mid).nbytes == took[mid]
            held.append(sorted(pool.loaded()))
        assert held == [["m/a"], ["m/b"], ["m/a"], ["m/b"]], device
        assert pool.evictions == ["m/a", "m/b", "m/a"]


def test_on_cuda_a_budget_in_float32_sizes_holds_both_half_precision_models(tmp_path, monkeypatch):
    """What the GPU check saw with its budget sized from the float32 files (1.5 x 92 kB = 138 kB): on CUDA the two
    models take 46 + 42 = 88 kB in float16, so both fit and neither is evicted; on the CPU they take 176 kB."""
    FakeCuda(monkeypatch)
    monkeypatch.setattr(pool_module, "load", half_on_cuda)
    for device, evicted in (("cpu", ["m/a", "m/b", "m/a"]), ("cuda:0", [])):
        registry = safetensors_registry(tmp_path / device, {"m/a": 23_000, "m/b": 21_000})
        pool = ModelPool(registry, device, budget_bytes=138_000)
        for mid in ("m/a", "m/b", "m/a", "m/b"):
            use(pool, mid)
        assert pool.evictions == evicted, device


def test_a_model_that_fits_in_half_precision_is_not_refused_for_its_float32_files(tmp_path, monkeypatch):
    FakeCuda(monkeypatch)
    monkeypatch.setattr(pool_module, "load", half_on_cuda)
    pool = ModelPool(safetensors_registry(tmp_path, {"m/a": 23_000}), "cuda:0", budget_bytes=60_000)
    assert use(pool, "m/a").nbytes == 46_000  # 92 kB on disk, 46 kB loaded: within the 60 kB
    with pytest.raises(NoRoom, match=r"^m/a needs about 92 kB, more than memory_budget_gb allows \(60 kB\)$"):
        use(ModelPool(pool.registry, "cpu", budget_bytes=60_000), "m/a")


def test_the_size_in_half_precision_reads_the_safetensors_header(tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "m" / "mixed"
    folder.mkdir(parents=True)
    save_file({"f32": torch.zeros(10), "f64": torch.zeros(2, 3, dtype=torch.float64), "f16": torch.zeros(4).half(),
               "bf16": torch.zeros(3, dtype=torch.bfloat16), "ids": torch.zeros(5, dtype=torch.int64),
               "mask": torch.zeros(7, dtype=torch.uint8)}, str(folder / "model.safetensors"))
    registry = Registry("minimal", tmp_path, (ModelSpec("m/mixed", "text-classification", "pipeline", "minimal"),))
    s = registry.get("m/mixed")
    on_disk = (folder / "model.safetensors").stat().st_size
    assert registry.expected_bytes(s) == on_disk  # as stored
    assert registry.expected_bytes(s, half=True) == 2 * (10 + 6 + 4 + 3) + 8 * 5 + 7  # floats at 2, the rest as stored
    (folder / "extra.bin").write_bytes(b"\0" * 1000)  # a pickle: its tensors unread, counted at its size on disk
    assert registry.expected_bytes(s, half=True) == 2 * 23 + 47 + 1000
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)  # a header that does not read: the size on disk
    assert registry.expected_bytes(s, half=True) == 64 + 1000
    (folder / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0[1, 2]  ")  # JSON, but not a header
    assert registry.expected_bytes(s, half=True) == 16 + 1000


def test_half_precision_is_for_cuda_and_the_loaders_that_take_a_dtype():
    def half(loader, task="text-classification", device="cuda:0"):
        return pool_module.half_precision(ModelSpec("m/x", task, loader, "minimal"), device)

    assert half("pipeline") and half("diffusers") and half("controlnet") and half("pipeline", device="cuda:1")
    assert not half("pipeline", device="cpu") and not half("diffusers", device="cpu")
    for task in ("automatic-speech-recognition", "audio-classification", "depth-estimation"):
        assert not half("pipeline", task) and half("diffusers", task)
    for loader in ("seq2seq", "extractive-qa", "sentence-embedding", "vision2seq", "vqa", "speecht5-vc",
                   "depth-normals", "controlnet-aux", "annotator"):
        assert not half(loader)


def test_on_cuda_out_of_memory_gives_the_cache_back(tmp_path, monkeypatch):
    cuda = FakeCuda(monkeypatch)
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB}), "cuda:0")
    with pytest.raises(NoRoom, match="ran out of memory on cuda:0"):
        with pool.use(pool.registry.get("m/a")):
            raise torch.OutOfMemoryError("CUDA out of memory")
    assert cuda.emptied == 1


def test_memory_reports_what_evictions_gave_back_and_the_process_size(tmp_path, monkeypatch):
    FakeLoads(monkeypatch)
    pool = ModelPool(sized_registry(tmp_path, {"m/a": 2 * MB, "m/b": 2 * MB}), "cpu", budget_bytes=3 * MB)
    monkeypatch.setattr(pool, "_allocated", lambda: sum(e.nbytes for e in pool.loaded().values()))
    use(pool, "m/a")
    assert "freed_on_eviction_bytes" not in pool.memory()
    use(pool, "m/b")
    report = pool.memory()
    assert report["freed_on_eviction_bytes"] == {"m/a": 2 * MB} and report["rss_bytes"] > 0
    assert report["models_bytes"] == 2 * MB and report["budget_bytes"] == 3 * MB


class FakePretrained:
    """A from_pretrained class replaced: remembers the folder, where it was moved and whether it was put in eval mode."""

    def __init__(self, where, **kwargs):
        self.where, self.kwargs, self.device, self.evaluating = where, kwargs, None, False
        self.config = types.SimpleNamespace(speaker_embedding_dim=4)

    @classmethod
    def from_pretrained(cls, where, **kwargs):
        return cls(where, **kwargs)

    def to(self, device):
        self.device = device
        return self

    def eval(self):
        self.evaluating = True
        return self


def test_every_part_of_a_model_goes_to_the_device_asked_for(models_dir, monkeypatch):
    import sentence_transformers
    import transformers

    for name in ("AutoTokenizer", "AutoModelForSeq2SeqLM", "AutoModelForQuestionAnswering", "AutoImageProcessor",
                 "VisionEncoderDecoderModel", "AutoProcessor", "AutoModelForVisualQuestionAnswering",
                 "SpeechT5FeatureExtractor", "SpeechT5ForSpeechToSpeech", "SpeechT5HifiGan"):
        monkeypatch.setattr(transformers, name, type(name, (FakePretrained,), {}))
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakePretrained)
    rec = Recorder()
    monkeypatch.setattr(transformers, "pipeline", rec)
    device = "meta"  # a device every machine has: where the parts go is all that is checked

    def parts(mid, task, loader, **extra):
        return loaded(models_dir, spec(mid, task, loader, **extra), device)

    _, model = parts("tiny/s2s", "summarization", "seq2seq")
    assert model.device == device and model.evaluating
    _, model = parts("tiny/qa", "question-answering", "extractive-qa")
    assert model.device == device and model.evaluating
    *_, model = parts("tiny/captioner", "image-to-text", "vision2seq")
    assert model.device == device and model.evaluating
    _, model = parts("tiny/vqa", "visual-question-answering", "vqa")
    assert model.device == device and model.evaluating and model.where == str(models_dir / "tiny/vqa")
    assert parts("tiny/clf", "sentence-similarity", "sentence-embedding").kwargs == {"device": device}
    fe, model, vocoder, speaker = parts("tiny/vc", "audio-to-audio", "speecht5-vc", base_model="tiny/hifigan")
    assert (model.device, vocoder.device, speaker.device.type) == (device, device, device)
    assert model.evaluating and vocoder.evaluating and vocoder.where == str(models_dir / "tiny/hifigan")
    assert tuple(speaker.shape) == (1, 4) and fe.where == str(models_dir / "tiny/vc")
    with pytest.raises(ValueError, match=r"^tiny/vc: the speecht5-vc loader needs `base_model` in its catalog entry$"):
        parts("tiny/vc", "audio-to-audio", "speecht5-vc")
    for folder in ("tiny/cn", "tiny/blip"):
        (models_dir / folder).mkdir(parents=True, exist_ok=True)
        (models_dir / folder / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^tiny/cn: the controlnet loader needs `base_model` in its catalog entry$"):
        parts("tiny/cn", "canny-control", "controlnet")

    class NotEncoderDecoder(FakePretrained):
        @classmethod
        def from_pretrained(cls, where, **kwargs):
            raise ValueError("not a VisionEncoderDecoderModel checkpoint")

    monkeypatch.setattr(transformers, "VisionEncoderDecoderModel", NotEncoderDecoder)
    monkeypatch.setattr(transformers, "AutoModelForImageTextToText", type("ImageTextToText", (FakePretrained,), {}))
    proc, _, model = parts("tiny/blip", "image-to-text", "vision2seq")  # BLIP, GIT: one processor, another class
    assert model.device == device and model.evaluating and model.where == str(models_dir / "tiny/blip")
    parts("tiny/depth", "normal-control", "depth-normals")
    assert rec.calls == [(("depth-estimation",), {"model": str(models_dir / "tiny/depth"), "device": device})]
