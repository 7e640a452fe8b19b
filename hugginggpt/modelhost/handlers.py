"""One handler per task family: decode the JARVIS body, run the loaded model, return plain JSON.

Files a handler makes are written under public/images|audios|videos/ and returned as {"path": ...}.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..backends.normalize import overlay_masks
from ..errors import BadRequest, ResourceError
from ..resources import DEFAULT_MAX_PIXELS, Resource, decode_image, new_output_path, resolve, save_image
from ..urlpolicy import UrlPolicy
from .pool import Loaded
from .progress import diffusion_steps, token_steps

MAX_NEW_TOKENS = 1024  # a client's `max_new_tokens` for the text generators
MAX_STEPS = 150  # a client's `steps` for the diffusion pipelines (JARVIS uses 20-25)
URL_FIELDS = ("img_url", "audio_url")  # the body's fields that may name a file by URL


@dataclass(frozen=True)
class Inputs:
    body: dict[str, Any]
    public_dir: Path
    max_bytes: int = 20 * 1024 * 1024
    timeout: float = 15.0
    policy: UrlPolicy | None = None  # for http(s) img_url / audio_url; None: the strict default
    max_pixels: int = DEFAULT_MAX_PIXELS
    fetched: dict[str, Resource | ResourceError] = field(default_factory=dict, compare=False, repr=False)

    def fetch_urls(self) -> None:
        """Fetch the body's http(s) `img_url` / `audio_url` now, on the request's own thread, before the model's
        turn and a compute thread are taken (LocalEngine.infer): a slow or stalled peer then holds its own
        request only, never the model (its other requests run) nor the CPU's compute thread (every model's
        calls), for up to `fetch_timeout`. A failure is kept and raised where the handler reads the field, so a
        field the task never reads fails nothing, as before."""
        for name in URL_FIELDS:
            ref = self.body.get(name)
            if isinstance(ref, str) and ref.strip().lower().startswith(("http://", "https://")):
                try:
                    self.fetched[name] = self._resolve(ref)
                except ResourceError as exc:
                    self.fetched[name] = exc

    def resource(self, name: str) -> Resource:
        """The bytes `name` (`img_url` or `audio_url`) names: fetched already, or resolved now."""
        ref = self.body.get(name)
        if not isinstance(ref, str) or not ref:
            raise BadRequest(f"`{name}` is required: a public/ path, an http(s) URL or a data URI")
        got = self.fetched.get(name)
        if isinstance(got, ResourceError):
            raise got
        if got is not None:
            return got
        return self._resolve(ref)

    def _resolve(self, ref: str) -> Resource:
        return resolve(ref, self.public_dir, self.max_bytes, self.timeout, policy=self.policy)

    def text(self, field: str = "text") -> str:
        value = self.body.get(field)
        if field == "text" and value is None:
            value = self.body.get("text1")
        if not isinstance(value, str) or not value.strip():
            raise BadRequest(f"`{field}` is required and must be a non-empty string")
        return value

    def number(self, field: str, default: float, low: float, high: float) -> float:
        """An optional numeric field, checked: a string, list, bool, NaN or out-of-range value is a 400."""
        value = self.body.get(field, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise BadRequest(f"`{field}` must be a number from {low:g} to {high:g}, got {str(value)[:40]!r}")
        return float(value)

    def integer(self, field: str, default: int, low: int, high: int) -> int:
        """An optional whole-number field (`max_new_tokens`, `steps`): a string, float, bool or out-of-range value is
        a 400, so no client can make a model generate or denoise without end."""
        return whole_number(self.body, field, default, low, high)

    def image(self):
        return decode_image(self.resource("img_url").data, self.max_pixels, what="`img_url`")

    def audio(self, rate: int = 16000) -> np.ndarray:
        import soundfile as sf

        res = self.resource("audio_url")
        try:
            data, sr = sf.read(io.BytesIO(res.data), dtype="float32", always_2d=True)
        except Exception:  # noqa: BLE001 - libsndfile raises its own types
            raise BadRequest("`audio_url` is not a readable audio file (wav, flac, ogg)") from None
        mono = data.mean(axis=1)
        if sr != rate and len(mono):
            n = int(round(len(mono) * rate / sr))
            mono = np.interp(np.linspace(0, len(mono) - 1, n), np.arange(len(mono)), mono).astype("float32")
        return mono

    def save_image(self, image) -> dict[str, str]:
        return {"path": save_image(self.public_dir, image)}

    def save_audio(self, samples: np.ndarray, rate: int) -> dict[str, str]:
        import soundfile as sf

        path, public = new_output_path(self.public_dir, "audio", "wav")
        sf.write(path, np.asarray(samples, dtype="float32").ravel(), int(rate))  # WAV: the name ends in .wav
        return {"path": public}


def plain(value: Any) -> Any:
    """Pipeline output -> JSON: no tensors, no numpy scalars, no PIL images."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items() if not hasattr(v, "save")}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        return value.tolist()
    return value


Handler = Callable[[Loaded, Inputs], Any]


# -- text ---------------------------------------------------------------------------------------


def text_pipeline(m: Loaded, i: Inputs) -> Any:
    return plain(m.obj(i.text()))


def token_classification(m: Loaded, i: Inputs) -> Any:
    return plain(m.obj(i.text(), aggregation_strategy="simple"))


def text_generation(m: Loaded, i: Inputs) -> Any:
    limit = i.integer("max_new_tokens", 40, 1, MAX_NEW_TOKENS)
    out = m.obj(i.text(), max_new_tokens=limit, do_sample=False, **token_steps(limit))
    return {"generated text": plain(out)[0]["generated_text"]}


def seq2seq(m: Loaded, i: Inputs) -> Any:
    import torch

    tokenizer, model = m.obj
    batch = tokenizer(i.text(), return_tensors="pt", truncation=True).to(model.device)
    batch.pop("token_type_ids", None)  # BERT-style tokenizers add them; encoder-decoders do not take them
    with torch.inference_mode():
        limit = i.integer("max_new_tokens", 128, 1, MAX_NEW_TOKENS)
        out = model.generate(**batch, max_new_tokens=limit, **token_steps(limit))
    return {"generated text": tokenizer.decode(out[0], skip_special_tokens=True)}


def question_answering(m: Loaded, i: Inputs) -> Any:
    import torch

    tokenizer, model = m.obj
    question = i.text()
    context = i.body.get("context")
    if not isinstance(context, str) or not context:
        raise BadRequest("`context` is required for question-answering: the passage to answer from")
    enc = tokenizer(question, context, return_tensors="pt", truncation=True, return_offsets_mapping=True)
    offsets = enc.pop("offset_mapping")[0]
    seq_ids = enc.sequence_ids(0)
    with torch.inference_mode():
        out = model(**enc.to(model.device))
    start_logits, end_logits = out.start_logits[0].cpu(), out.end_logits[0].cpu()
    ctx = [k for k, s in enumerate(seq_ids) if s == 1]
    starts, ends = start_logits.tolist(), end_logits.tolist()
    # the best start + end in the context, at most 30 tokens long; of equals, the earliest
    s, e = max(((s, e) for s in ctx for e in ctx if s <= e < s + 30), key=lambda span: starts[span[0]] + ends[span[1]])
    start, end = int(offsets[s][0]), int(offsets[e][1])
    prob = torch.softmax(start_logits[ctx], 0)[ctx.index(s)] * torch.softmax(end_logits[ctx], 0)[ctx.index(e)]
    return {"answer": context[start:end], "score": float(prob), "start": start, "end": end}


def sentence_similarity(m: Loaded, i: Inputs) -> Any:
    return _similarity(m, i.text(), i.text("text2"))


def _similarity(m: Loaded, a: str, b: str) -> dict[str, float]:
    if hasattr(m.obj, "encode"):
        emb = m.obj.encode([a, b], normalize_embeddings=True, show_progress_bar=False)
        return {"score": float(np.dot(emb[0], emb[1]))}
    feats = [np.asarray(m.obj(t)[0]).mean(axis=0) for t in (a, b)]
    return {"score": float(np.dot(feats[0], feats[1]) / (np.linalg.norm(feats[0]) * np.linalg.norm(feats[1])))}


# -- vision -------------------------------------------------------------------------------------


def image_pipeline(m: Loaded, i: Inputs) -> Any:
    return plain(m.obj(i.image()))


def object_detection(m: Loaded, i: Inputs) -> Any:
    threshold = i.body.get("threshold", 0.5)
    if not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise BadRequest("`threshold` must be a number between 0 and 1")
    return plain(m.obj(i.image(), threshold=float(threshold)))


def image_segmentation(m: Loaded, i: Inputs) -> Any:
    image = i.image()
    segments = m.obj(image)
    predicted = [{"label": seg.get("label"), "score": plain(seg.get("score"))} for seg in segments]
    return {**i.save_image(overlay_masks(image, [seg["mask"] for seg in segments])), "predicted": predicted}


def depth_estimation(m: Loaded, i: Inputs) -> Any:
    return i.save_image(m.obj(i.image())["depth"])  # the pipeline's depth is a grey (mode L) image already


def image_to_text(m: Loaded, i: Inputs) -> Any:
    import torch

    processor, tokenizer, model = m.obj
    image = i.image()
    pixel = processor(images=image, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**{k: v.to(model.device) for k, v in pixel.items()}, max_new_tokens=30)
    return {"generated text": tokenizer.batch_decode(out, skip_special_tokens=True)[0].strip()}


def visual_qa(m: Loaded, i: Inputs) -> Any:
    import torch

    processor, model = m.obj
    enc = processor(i.image(), i.text(), return_tensors="pt").to(model.device)
    with torch.inference_mode():
        logits = model(**enc).logits[0]
    probs = torch.softmax(logits, -1)
    top = torch.topk(probs, k=min(5, probs.numel()))
    pairs = zip(top.values, top.indices, strict=True)  # pragma: no mutate: topk's two are always as long
    return [{"answer": model.config.id2label[int(k)], "score": float(v)} for v, k in pairs]


def document_qa(m: Loaded, i: Inputs) -> Any:
    """LayoutLM reads words with their boxes: from `word_boxes` in the body, or from Tesseract OCR."""
    boxes = i.body.get("word_boxes")
    kwargs: dict[str, Any] = {}
    if boxes is not None:
        if not (isinstance(boxes, list) and all(isinstance(b, (list, tuple)) and len(b) == 2 and isinstance(b[0], str)
                                                 and isinstance(b[1], (list, tuple)) and len(b[1]) == 4 for b in boxes)):
            raise BadRequest("`word_boxes` must be a list of [word, [x0, y0, x1, y1]] (boxes on a 0-1000 scale)")
        kwargs["word_boxes"] = [(w, [int(v) for v in box]) for w, box in boxes]
    image, question = i.image(), i.text()
    try:
        return plain(m.obj(image, question, **kwargs))
    except (ValueError, OSError) as exc:  # transformers without pytesseract; pytesseract without its tesseract binary
        if "tesseract" in str(exc).lower():
            raise BadRequest("document question answering needs OCR on the models server (apt-get install "
                             "tesseract-ocr; pip install pytesseract) or `word_boxes` in the request") from None
        raise


def image_to_image(m: Loaded, i: Inputs) -> Any:
    prompt = i.body.get("text") or "improve the image"
    steps = i.integer("steps", 20, 1, MAX_STEPS)
    out = m.obj(prompt, image=i.image(), num_inference_steps=steps, **diffusion_steps(m.obj, steps))
    return i.save_image(out.images[0])


# -- generation ---------------------------------------------------------------------------------


def text_to_image(m: Loaded, i: Inputs) -> Any:
    steps = i.integer("steps", 25, 1, MAX_STEPS)
    out = m.obj(i.text(), num_inference_steps=steps, **diffusion_steps(m.obj, steps))
    return i.save_image(out.images[0])


def text_to_video(m: Loaded, i: Inputs) -> Any:
    from diffusers.utils import export_to_video

    steps = i.integer("steps", 25, 1, MAX_STEPS)
    frames = m.obj(i.text(), num_inference_steps=steps, **diffusion_steps(m.obj, steps)).frames[0]
    path, public = new_output_path(i.public_dir, "video", "mp4")
    export_to_video(frames, str(path))
    return {"path": public}


def sobel(gray: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Horizontal and vertical 3x3 Sobel responses (zero on the border), in NumPy: no OpenCV needed."""
    gx = np.zeros_like(gray)
    gy = np.zeros_like(gray)
    gx[1:-1, 1:-1] = (gray[:-2, 2:] + 2 * gray[1:-1, 2:] + gray[2:, 2:]) - (gray[:-2, :-2] + 2 * gray[1:-1, :-2] + gray[2:, :-2])
    gy[1:-1, 1:-1] = (gray[2:, :-2] + 2 * gray[2:, 1:-1] + gray[2:, 2:]) - (gray[:-2, :-2] + 2 * gray[:-2, 1:-1] + gray[:-2, 2:])
    return gx, gy


def canny_control(m: Loaded, i: Inputs) -> Any:
    """Edge map for ControlNet: Sobel magnitude with two thresholds."""
    from PIL import Image

    gx, gy = sobel(np.asarray(i.image().convert("L"), dtype="float32"))
    mag = np.hypot(gx, gy)
    low, high = i.number("low_threshold", 100, 0, 2000), i.number("high_threshold", 200, 0, 2000)
    edges = np.where(mag >= high, 255, np.where(mag >= low, 128, 0)).astype("uint8")  # pragma: no mutate: any int type
    return i.save_image(Image.fromarray(edges).convert("RGB"))


def normals_from_depth(depth: np.ndarray, bg_threshold: float = 0.4) -> np.ndarray:
    """An RGB normal map (uint8) from a relative depth map, the recipe the sd-controlnet-normal card gives.

    Depth gradients give the x and y of each normal and a constant 2*pi its z, so flat regions face the
    viewer; pixels nearer the back than `bg_threshold` (of the depth range) are background and face it too.
    """
    depth = np.asarray(depth, dtype="float32")  # a grey image's uint8 would wrap below zero in the gradients
    back = depth < depth.min() + bg_threshold * (depth.max() - depth.min())
    gx, gy = sobel(depth)
    gx[back] = 0
    gy[back] = 0
    normal = np.stack([gx, gy, np.full_like(gx, 2 * np.pi)], axis=2)
    normal /= np.sqrt((normal ** 2).sum(axis=2, keepdims=True))
    return (normal * 127.5 + 127.5).astype("uint8")  # unit vectors: 0 to 255 already


def normal_control(m: Loaded, i: Inputs) -> Any:
    from PIL import Image

    image = i.image()
    depth = np.asarray(m.obj(image)["depth"].convert("L").resize(image.size))  # normals_from_depth makes it float
    return i.save_image(Image.fromarray(normals_from_depth(depth, float(i.body.get("bg_threshold", 0.4)))))


def aux_annotator(m: Loaded, i: Inputs) -> Any:
    """A controlnet_aux detector: image in, control image (PIL) out."""
    return i.save_image(m.obj(i.image()).convert("RGB"))


def controlnet_generation(m: Loaded, i: Inputs) -> Any:
    steps = i.integer("steps", 20, 1, MAX_STEPS)
    out = m.obj(i.text(), image=i.image(), num_inference_steps=steps, **diffusion_steps(m.obj, steps))
    return i.save_image(out.images[0])


# -- audio --------------------------------------------------------------------------------------


def _rate_of(pipe: Any, default: int = 16000) -> int:
    fe = getattr(pipe, "feature_extractor", None)
    return int(getattr(fe, "sampling_rate", None) or default)


def speech_recognition(m: Loaded, i: Inputs) -> Any:
    rate = _rate_of(m.obj)
    out = m.obj({"raw": i.audio(rate), "sampling_rate": rate})
    return {"text": out["text"].strip()}


def audio_classification(m: Loaded, i: Inputs) -> Any:
    rate = _rate_of(m.obj)
    return plain(m.obj({"raw": i.audio(rate), "sampling_rate": rate}))


def text_to_speech(m: Loaded, i: Inputs) -> Any:
    out = m.obj(i.text())
    return i.save_audio(out["audio"], out["sampling_rate"])


def audio_to_audio(m: Loaded, i: Inputs) -> Any:
    if m.spec.loader == "speecht5-vc":  # voice conversion: features -> spectrogram -> HiFi-GAN waveform
        import torch

        features, model, vocoder, speaker = m.obj
        batch = features(audio=i.audio(16000), sampling_rate=16000, return_tensors="pt")
        with torch.inference_mode():
            speech = model.generate_speech(batch["input_values"].to(model.device), speaker, vocoder=vocoder)
        return i.save_audio(speech.float().cpu().numpy(), 16000)
    rate = _rate_of(m.obj)
    out = m.obj({"raw": i.audio(rate), "sampling_rate": rate})
    first = out[0] if isinstance(out, list) else out
    return i.save_audio(first.get("audio", first.get("blob")), first.get("sampling_rate", rate))


HANDLERS: dict[str, Handler] = {
    "text-classification": text_pipeline,
    "token-classification": token_classification,
    "question-answering": question_answering,
    "summarization": seq2seq,
    "translation": seq2seq,
    "text2text-generation": seq2seq,
    "text-generation": text_generation,
    "conversational": text_generation,
    "sentence-similarity": sentence_similarity,
    "image-classification": image_pipeline,
    "object-detection": object_detection,
    "image-segmentation": image_segmentation,
    "depth-estimation": depth_estimation,
    "image-to-text": image_to_text,
    "visual-question-answering": visual_qa,
    "document-question-answering": document_qa,
    "image-to-image": image_to_image,
    "text-to-image": text_to_image,
    "text-to-video": text_to_video,
    "canny-control": canny_control,
    "normal-control": normal_control,
    **{f"{c}-control": aux_annotator for c in ("hed", "mlsd", "openpose")},
    **{f"{c}-text-to-image": controlnet_generation for c in ("canny", "depth", "hed", "mlsd", "normal", "openpose", "seg")},
    "automatic-speech-recognition": speech_recognition,
    "audio-classification": audio_classification,
    "text-to-speech": text_to_speech,
    "audio-to-audio": audio_to_audio,
}


# -- batches (batching.py gathers the requests; these say how one batch runs) ---------------------------


@dataclass(frozen=True)
class Batchable:
    """A task whose concurrent requests can share one call of the model.

    `prepare` reads one request's input in its caller's thread (its BadRequest is that caller's alone); `run` takes
    the prepared inputs of a batch and returns one output per input, each equal to what the task's handler returns
    for that input alone. Tasks whose calls take per-request options (thresholds, token limits) are not here.
    """

    prepare: Callable[[Inputs], Any]
    run: Callable[[Loaded, list[Any]], list[Any]]


def _pipeline_each(m: Loaded, inputs: list[Any], **kwargs: Any) -> list[Any]:
    """One pipeline call for the batch; one input alone is called as the handler calls it (no batching machinery).

    A pipeline called on a list answers one entry per input; with top_k 1 the entry is a dict, not a list."""
    if len(inputs) == 1:
        return [plain(m.obj(inputs[0], **kwargs))]
    out = list(m.obj(inputs, batch_size=len(inputs), **kwargs))
    if len(out) != len(inputs):
        raise RuntimeError(f"the pipeline gave {len(out)} outputs for {len(inputs)} inputs")
    return [plain(o if isinstance(o, list) else [o]) for o in out]


def _classify_texts(m: Loaded, texts: list[str]) -> list[Any]:
    return _pipeline_each(m, texts)


def _tag_texts(m: Loaded, texts: list[str]) -> list[Any]:
    return _pipeline_each(m, texts, aggregation_strategy="simple")


def _classify_images(m: Loaded, images: list[Any]) -> list[Any]:
    return _pipeline_each(m, images)


def _similarities(m: Loaded, pairs: list[tuple[str, str]]) -> list[Any]:
    if not hasattr(m.obj, "encode"):  # a feature-extraction pipeline: one pair at a time, as the handler does
        return [_similarity(m, a, b) for a, b in pairs]
    emb = m.obj.encode([t for pair in pairs for t in pair], normalize_embeddings=True, show_progress_bar=False,
                       batch_size=2 * len(pairs))
    return [{"score": float(np.dot(emb[2 * k], emb[2 * k + 1]))} for k in range(len(pairs))]


def _captions(m: Loaded, images: list[Any]) -> list[Any]:
    import torch

    processor, tokenizer, model = m.obj
    pixel = processor(images=images, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**{k: v.to(model.device) for k, v in pixel.items()}, max_new_tokens=30)
    return [{"generated text": text.strip()} for text in tokenizer.batch_decode(out, skip_special_tokens=True)]


BATCHABLE: dict[str, Batchable] = {
    "text-classification": Batchable(lambda i: i.text(), _classify_texts),
    "token-classification": Batchable(lambda i: i.text(), _tag_texts),
    "sentence-similarity": Batchable(lambda i: (i.text(), i.text("text2")), _similarities),
    "image-classification": Batchable(lambda i: i.image(), _classify_images),
    "image-to-text": Batchable(lambda i: i.image(), _captions),
}

MAX_DEPTH = 32  # no request body of this protocol nests deeper than a few levels


def _check_text(text: str, where: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{where} contains invalid Unicode (a lone surrogate at position {exc.start})") from None


def whole_number(body: dict[str, Any], field: str, default: int, low: int, high: int) -> int:
    value = body.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"`{field}` must be a whole number from {low} to {high}, got {str(value)[:40]!r}")
    return value


# The options a handler reads whatever its model, with the bounds every handler holds them to.
OPTIONS = {"steps": (1, MAX_STEPS), "max_new_tokens": (1, MAX_NEW_TOKENS)}


def check_options(body: dict[str, Any]) -> None:
    """The options of OPTIONS a body sets, checked before any model loads or any stream starts: a bad one is the
    same 400 for a one-shot and a streamed call (a stream, once started, can only answer 200)."""
    for name, (low, high) in OPTIONS.items():
        if name in body:
            whole_number(body, name, low, low, high)


def check_body(value: Any, where: str = "the body", depth: int = 0) -> None:
    """Refuse what no handler can use before any model runs: lone UTF-16 surrogates (JSON can carry `\\ud800`;
    nothing downstream encodes it) and nesting deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise BadRequest(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)  # JSON keys are strings, as deep as their values
            check_body(item, f"`{key}`" if depth == 0 else where, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_body(item, where, depth + 1)


def handle(task: str, loaded: Loaded, inputs: Inputs) -> Any:
    handler = HANDLERS.get(task)
    if handler is None:
        raise BadRequest(f"no handler for task {task}")
    return handler(loaded, inputs)


__all__ = ["BATCHABLE", "HANDLERS", "Batchable", "Inputs", "handle", "plain", "ResourceError"]
