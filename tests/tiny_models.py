"""Tiny random-weight models saved under real registry ids, so the real loading code runs offline.

Each builder writes `<models_dir>/<org>/<name>` with `save_pretrained`, like a downloaded snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "is", "on", "table", "anna",
         "lives", "in", "berlin", "paris", "red", "fox", "what", "where", "who", "sits", "mat", "hello", "world",
         "good", "bad", "movie", "great", ".", ",", "?", "!"] + [f"w{i}" for i in range(60)]


def bert_tokenizer(folder: Path):
    from transformers import BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(WORDS) + "\n")
    tok = BertTokenizerFast(vocab_file=str(vocab), do_lower_case=True)
    tok.save_pretrained(folder)
    return tok


def words_tokenizer(folder: Path) -> None:
    """A tokenizer that knows WORDS (the one bert_tokenizer saves reads every word as [UNK] under transformers 5),
    so that different texts give different answers."""
    from transformers import BertTokenizer

    BertTokenizer(vocab={w: k for k, w in enumerate(WORDS)}, do_lower_case=True).save_pretrained(folder)


def built_once(name: str, build: Callable[[Path], None], *builders: Callable) -> Path:
    """The models `build` writes, in a temporary folder named after this file and the builders' source, built the
    first time and reused after (the mutation audit runs a test file once per mutant, each in a fresh process).
    It is built in a staging folder and renamed into place, so a run stopped halfway leaves nothing half-built."""
    digest = hashlib.sha1(Path(__file__).read_bytes())
    for part in (build, *builders):
        digest.update(inspect.getsource(part).encode())
    folder = Path(tempfile.gettempdir()) / f"hugginggpt-{name}-{digest.hexdigest()[:12]}"
    if not (folder / "complete").is_file():
        staging = Path(tempfile.mkdtemp(prefix=f"hugginggpt-{name}-staging-"))
        try:
            build(staging)
            (staging / "complete").write_text("")
            if not (folder / "complete").is_file():  # another process may have finished it meanwhile
                shutil.rmtree(folder, ignore_errors=True)  # a half-built one, left by a run stopped mid-rename
                with contextlib.suppress(OSError):  # another process put its copy there in between
                    os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder


def close(a: object, b: object, tolerance: float) -> bool:
    """Equal, with floats to `tolerance`, through dicts and lists (a padded batch sums in another order than one
    input alone, so a model's scores differ in the last digits)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tolerance) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=0, abs_tol=tolerance)
    return a == b


def bert_config(**extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=37, max_position_embeddings=128, **extra)


def text_classifier(folder: Path) -> None:
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    bert_tokenizer(folder)
    BertForSequenceClassification(bert_config(num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"},
                                              label2id={"NEGATIVE": 0, "POSITIVE": 1})).save_pretrained(folder)


def token_classifier(folder: Path) -> None:
    import torch
    from transformers import BertForTokenClassification

    torch.manual_seed(0)
    bert_tokenizer(folder)
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    BertForTokenClassification(bert_config(num_labels=len(labels), id2label=dict(enumerate(labels)),
                                           label2id={v: k for k, v in enumerate(labels)})).save_pretrained(folder)


def extractive_qa(folder: Path) -> None:
    import torch
    from transformers import BertForQuestionAnswering

    torch.manual_seed(0)
    bert_tokenizer(folder)
    BertForQuestionAnswering(bert_config()).save_pretrained(folder)


def causal_lm(folder: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    tok = bert_tokenizer(folder)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(WORDS), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                               pad_token_id=tok.pad_token_id)).save_pretrained(folder)


def seq2seq_lm(folder: Path) -> None:
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    tok = bert_tokenizer(folder)
    config = BartConfig(vocab_size=len(WORDS), d_model=32, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37,
                        max_position_embeddings=128, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                        eos_token_id=tok.sep_token_id, decoder_start_token_id=tok.cls_token_id,
                        forced_eos_token_id=tok.sep_token_id)
    model = BartForConditionalGeneration(config)
    model.generation_config.max_length = 20
    model.save_pretrained(folder)


def image_classifier(folder: Path) -> None:
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    labels = ["tabby cat", "golden retriever", "rocket"]
    ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=37, num_labels=3,
                                        id2label=dict(enumerate(labels)),
                                        label2id={v: k for k, v in enumerate(labels)})).save_pretrained(folder)


def speech_recognizer(folder: Path) -> None:
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC, Wav2Vec2Processor

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    letters = ["<pad>", "<s>", "</s>", "<unk>", "|"] + list("abcdefghijklmnopqrstuvwxyz'")
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(letters)}))
    tok = Wav2Vec2CTCTokenizer(str(folder / "vocab.json"), word_delimiter_token="|")
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True,
                                  return_attention_mask=False)
    Wav2Vec2Processor(feature_extractor=fe, tokenizer=tok).save_pretrained(folder)
    config = Wav2Vec2Config(vocab_size=len(letters), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=37, conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 8),
                            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, pad_token_id=0,
                            do_stable_layer_norm=True, feat_extract_norm="layer")
    Wav2Vec2ForCTC(config).save_pretrained(folder)


def tts_vits(folder: Path) -> None:
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    chars = list(" abcdefghijklmnopqrstuvwxyz'.,?!-")
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(chars)}))
    VitsTokenizer(str(folder / "vocab.json"), add_blank=True, normalize=True, phonemize=False).save_pretrained(folder)
    config = VitsConfig(vocab_size=len(chars), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=16,
                        flow_size=16, spectrogram_bins=17, upsample_initial_channel=16, upsample_rates=[4, 4],
                        upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
                        prior_encoder_num_flows=1, prior_encoder_num_wavenet_layers=1,
                        posterior_encoder_num_wavenet_layers=1, duration_predictor_num_flows=1,
                        duration_predictor_filter_channels=16, depth_separable_num_layers=1, sampling_rate=16000)
    VitsModel(config).save_pretrained(folder)


def object_detector(folder: Path) -> None:
    import torch
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    YolosImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(folder)
    labels = ["cat", "dog"]
    YolosForObjectDetection(YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=37, num_detection_tokens=5,
                                        num_labels=2, id2label=dict(enumerate(labels)),
                                        label2id={v: k for k, v in enumerate(labels)})).save_pretrained(folder)


def image_captioner(folder: Path) -> None:
    import torch
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel, ViTConfig, ViTImageProcessor

    torch.manual_seed(0)
    tok = bert_tokenizer(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    encoder = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37)
    decoder = GPT2Config(vocab_size=len(WORDS), n_positions=64, n_embd=32, n_layer=1, n_head=2, add_cross_attention=True,
                         is_decoder=True, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                         pad_token_id=tok.pad_token_id)
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.pad_token_id = tok.cls_token_id, tok.pad_token_id
    config.eos_token_id = tok.sep_token_id
    VisionEncoderDecoderModel(config=config).save_pretrained(folder)


def _sd_parts(folder: Path) -> dict:
    """Tokenizer, text encoder, VAE and scheduler of a few thousand random weights, shared by the pipelines."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "!": 2}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), pad_token="!", model_max_length=77)
    for name in ("vocab.json", "merges.txt"):
        (folder / name).unlink()
    vae = AutoencoderKL(block_out_channels=[8, 16], in_channels=3, out_channels=3,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                        latent_channels=4, norm_num_groups=4, sample_size=16)
    text_encoder = CLIPTextModel(CLIPTextConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=16,
                                                num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=77,
                                                projection_dim=16, bos_token_id=0, eos_token_id=1, pad_token_id=2))
    return {"vae": vae, "text_encoder": text_encoder, "tokenizer": tokenizer, "scheduler": DDIMScheduler()}


def _unet2d(in_channels: int = 4):
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=in_channels,
                                out_channels=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                attention_head_dim=2, norm_num_groups=4)


def tiny_stable_diffusion(folder: Path) -> None:
    """A Stable Diffusion pipeline of a few thousand random weights: real diffusers loading and sampling."""
    from diffusers import StableDiffusionPipeline

    parts = _sd_parts(folder)
    StableDiffusionPipeline(unet=_unet2d(), **parts, safety_checker=None, feature_extractor=None,
                            requires_safety_checker=False).save_pretrained(folder)


def tiny_instruct_pix2pix(folder: Path) -> None:
    """InstructPix2Pix: the UNet reads the noisy latents and the input image's latents (8 channels)."""
    from diffusers import StableDiffusionInstructPix2PixPipeline

    parts = _sd_parts(folder)
    StableDiffusionInstructPix2PixPipeline(unet=_unet2d(in_channels=8), **parts, safety_checker=None,
                                           feature_extractor=None, requires_safety_checker=False).save_pretrained(folder)


def tiny_text_to_video(folder: Path) -> None:
    from diffusers import TextToVideoSDPipeline, UNet3DConditionModel

    parts = _sd_parts(folder)
    unet = UNet3DConditionModel(block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4,
                                out_channels=4, down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
                                up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"), cross_attention_dim=16,
                                attention_head_dim=2, norm_num_groups=4)
    TextToVideoSDPipeline(unet=unet, **parts).save_pretrained(folder)


def tiny_controlnet(folder: Path) -> None:
    """A ControlNet that plugs into the tiny Stable Diffusion (same blocks, cross-attention width 16)."""
    import torch
    from diffusers import ControlNetModel

    torch.manual_seed(0)
    ControlNetModel(block_out_channels=(8, 16), layers_per_block=1, in_channels=4,
                    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), cross_attention_dim=16,
                    attention_head_dim=2, norm_num_groups=4,
                    conditioning_embedding_out_channels=(4, 8)).save_pretrained(folder)


def image_segmenter(folder: Path) -> None:
    import torch
    from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessor

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    SegformerImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    labels = ["sky", "tree", "road"]
    SegformerForSemanticSegmentation(SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=3,
        id2label=dict(enumerate(labels)), label2id={v: k for k, v in enumerate(labels)})).save_pretrained(folder)


def depth_estimator(folder: Path) -> None:
    import torch
    from transformers import DPTConfig, DPTForDepthEstimation, DPTImageProcessor

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    DPTImageProcessor(size={"height": 32, "width": 32}, keep_aspect_ratio=False).save_pretrained(folder)
    DPTForDepthEstimation(DPTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=4,
                                    num_attention_heads=2, intermediate_size=37, backbone_out_indices=[0, 1, 2, 3],
                                    neck_hidden_sizes=[8, 8, 16, 16], fusion_hidden_size=16,
                                    is_hybrid=False)).save_pretrained(folder)


def document_qa(folder: Path) -> None:
    import torch
    from transformers import LayoutLMConfig, LayoutLMForQuestionAnswering, LayoutLMTokenizerFast

    torch.manual_seed(0)
    bert_tokenizer(folder)
    LayoutLMTokenizerFast.from_pretrained(folder, model_max_length=128).save_pretrained(folder)
    LayoutLMForQuestionAnswering(LayoutLMConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=37, max_position_embeddings=128,
                                                max_2d_position_embeddings=1024)).save_pretrained(folder)


VQA_ANSWERS = ["yes", "no", "two", "red"]


def visual_qa(folder: Path) -> None:
    import torch
    from transformers import ViltConfig, ViltForQuestionAnswering, ViltImageProcessor, ViltProcessor

    torch.manual_seed(0)
    tok = bert_tokenizer(folder)
    ViltProcessor(image_processor=ViltImageProcessor(size={"shortest_edge": 32}, size_divisor=8),
                  tokenizer=tok).save_pretrained(folder)
    ViltForQuestionAnswering(ViltConfig(
        vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
        image_size=32, patch_size=8, max_position_embeddings=40, num_labels=len(VQA_ANSWERS),
        id2label=dict(enumerate(VQA_ANSWERS)), label2id={v: k for k, v in enumerate(VQA_ANSWERS)})).save_pretrained(folder)


AUDIO_LABELS = ["speech", "music", "dog bark"]


def audio_classifier(folder: Path) -> None:
    import torch
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    ASTFeatureExtractor(num_mel_bins=16, max_length=64).save_pretrained(folder)
    ASTForAudioClassification(ASTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, patch_size=16,
        frequency_stride=10, time_stride=10, max_length=64, num_mel_bins=16, num_labels=len(AUDIO_LABELS),
        id2label=dict(enumerate(AUDIO_LABELS)), label2id={v: k for k, v in enumerate(AUDIO_LABELS)})).save_pretrained(folder)


def voice_converter(folder: Path) -> None:
    import torch
    from transformers import SpeechT5Config, SpeechT5FeatureExtractor, SpeechT5ForSpeechToSpeech

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    SpeechT5FeatureExtractor(num_mel_bins=16).save_pretrained(folder)
    SpeechT5ForSpeechToSpeech(SpeechT5Config(
        vocab_size=40, hidden_size=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, conv_dim=(16, 16), conv_stride=(5, 4),
        conv_kernel=(10, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, num_mel_bins=16,
        speech_decoder_prenet_units=16, speech_decoder_postnet_units=16, speech_decoder_postnet_layers=2,
        speaker_embedding_dim=8, max_speech_positions=600, max_text_positions=64)).save_pretrained(folder)


def hifigan_vocoder(folder: Path) -> None:
    import torch
    from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

    torch.manual_seed(0)
    SpeechT5HifiGan(SpeechT5HifiGanConfig(model_in_dim=16, upsample_initial_channel=16, upsample_rates=[4, 4],
                                          upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3],
                                          resblock_dilation_sizes=[[1, 3]], sampling_rate=16000)).save_pretrained(folder)


FULL_BUILDERS = {
    "stable-diffusion-v1-5/stable-diffusion-v1-5": tiny_stable_diffusion,
    "lllyasviel/sd-controlnet-canny": tiny_controlnet,
    "timbrooks/instruct-pix2pix": tiny_instruct_pix2pix,
    "damo-vilab/text-to-video-ms-1.7b": tiny_text_to_video,
    "microsoft/speecht5_vc": voice_converter,
    "microsoft/speecht5_hifigan": hifigan_vocoder,
}


BUILDERS = {
    "hustvl/yolos-tiny": object_detector,
    "nlpconnect/vit-gpt2-image-captioning": image_captioner,
    "facebook/mms-tts-eng": tts_vits,
    "distilbert/distilbert-base-uncased-finetuned-sst-2-english": text_classifier,
    "dslim/bert-base-NER": token_classifier,
    "deepset/roberta-base-squad2": extractive_qa,
    "openai-community/gpt2": causal_lm,
    "sshleifer/distilbart-cnn-12-6": seq2seq_lm,
    "google/vit-base-patch16-224": image_classifier,
    "facebook/wav2vec2-base-960h": speech_recognizer,
    "nvidia/segformer-b0-finetuned-ade-512-512": image_segmenter,
    "Intel/dpt-large": depth_estimator,
    "Intel/dpt-hybrid-midas": depth_estimator,  # the depth model the normal-control annotator runs
    "dandelin/vilt-b32-finetuned-vqa": visual_qa,
    "MIT/ast-finetuned-audioset-10-10-0.4593": audio_classifier,
    "impira/layoutlm-document-qa": document_qa,
    # same architectures under the ids of the other text task types, so each type runs through its own route
    "Helsinki-NLP/opus-mt-en-de": seq2seq_lm,
    "google/flan-t5-base": seq2seq_lm,
    "microsoft/DialoGPT-medium": causal_lm,
}


def build_all(models_dir: Path) -> dict[str, Path]:
    out = {}
    for mid, builder in BUILDERS.items():
        target = models_dir / mid
        if not (target / "config.json").is_file():
            builder(target)
        out[mid] = target
    return out
