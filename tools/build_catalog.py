"""Writes data/p0_models.jsonl: our hand-curated catalog of well-known Hugging Face models.

The one place models are written down: what the planner's selection ranks (likes, downloads, tags,
languages, descriptions) and, for the models the local models server can run, how it loads them and at
which deployment level (the `local` object of a row; `hugginggpt/modelhost/registry.py` reads it).
Likes and downloads are rounded snapshots used only for ranking; descriptions are written for this project.

    python tools/build_catalog.py           # rewrite data/p0_models.jsonl
    python tools/build_catalog.py --check   # exit 1 if the file differs from what this table writes
    python tools/build_catalog.py sync --config CONFIG [--per-task N] [--tasks T ...] [--full]
                                            # fill the config's catalog_store from the Hub (see `sync --help`)
"""

import argparse
import json
import sys
from pathlib import Path

M = {
"token-classification": [
 ("dslim/bert-base-NER", 560, 2400000, "ner,bert", "en", "BERT fine-tuned on CoNLL-2003 English named entities: persons, organisations, locations, misc."),
 ("dslim/bert-large-NER", 150, 300000, "ner,bert", "en", "Larger BERT for English named entity recognition on CoNLL-2003; more accurate, slower."),
 ("Jean-Baptiste/camembert-ner", 110, 900000, "ner,camembert", "fr", "CamemBERT fine-tuned for French named entities: persons, organisations, locations."),
 ("Davlan/bert-base-multilingual-cased-ner-hrl", 70, 250000, "ner,multilingual", "multilingual", "Multilingual BERT for named entities in ten high-resource languages including Arabic, German, Chinese."),
 ("flair/ner-german", 40, 60000, "ner,flair", "de", "Flair tagger for German named entity recognition: persons, locations, organisations in German text."),
 ("fhswf/bert_de_ner", 10, 20000, "ner,bert", "de", "German BERT fine-tuned on GermEval 2014 to find named entities in German sentences."),
 ("vblagoje/bert-english-uncased-finetuned-pos", 40, 150000, "pos,part-of-speech", "en", "Part-of-speech tagging of English text with an uncased BERT."),
 ("ckiplab/bert-base-chinese-ner", 90, 90000, "ner,bert", "zh", "Chinese BERT tagging named entities in Traditional Chinese text."),
 ("dbmdz/bert-large-cased-finetuned-conll03-english", 70, 1500000, "ner,bert", "en", "Large cased BERT fine-tuned on CoNLL-03 English named entities; the classic NER pipeline default."),
 ("oliverguhr/fullstop-punctuation-multilang-large", 140, 120000, "punctuation", "multilingual", "Restores punctuation in English, German, French and Italian transcripts."),
],
"text-classification": [
 ("distilbert/distilbert-base-uncased-finetuned-sst-2-english", 700, 5000000, "sentiment-analysis,distilbert", "en", "Fast English sentiment analysis: positive or negative, trained on SST-2 movie reviews."),
 ("cardiffnlp/twitter-roberta-base-sentiment-latest", 700, 2500000, "sentiment-analysis,twitter", "en", "RoBERTa for sentiment of English tweets: negative, neutral, positive."),
 ("j-hartmann/emotion-english-distilroberta-base", 400, 800000, "emotion", "en", "Detects emotions in English text: anger, disgust, fear, joy, neutral, sadness, surprise."),
 ("nlptown/bert-base-multilingual-uncased-sentiment", 400, 1000000, "sentiment-analysis,reviews", "multilingual", "Product review sentiment as 1 to 5 stars in English, Dutch, German, French, Spanish, Italian."),
 ("oliverguhr/german-sentiment-bert", 60, 200000, "sentiment-analysis", "de", "Sentiment of German text: positive, negative, neutral."),
 ("unitary/toxic-bert", 170, 600000, "toxicity,moderation", "en", "Flags toxic, obscene, threatening or insulting English comments."),
 ("papluca/xlm-roberta-base-language-detection", 300, 1000000, "language-identification", "multilingual", "Identifies which of 20 languages a text is written in."),
 ("ProsusAI/finbert", 900, 1500000, "sentiment-analysis,finance", "en", "Sentiment of financial news and reports: positive, negative, neutral."),
 ("SamLowe/roberta-base-go_emotions", 500, 900000, "emotion", "en", "Multi-label classification of 28 fine-grained emotions in English text."),
 ("facebook/bart-large-mnli", 1300, 3000000, "zero-shot-classification,nli", "en", "Natural language inference; classifies text into any labels you name (zero-shot)."),
],
"text2text-generation": [
 ("google/flan-t5-large", 700, 1000000, "t5,instruction", "en", "Instruction-tuned T5 that follows short task instructions: answer, rewrite, classify."),
 ("google/flan-t5-base", 900, 2000000, "t5,instruction", "en", "Smaller instruction-tuned T5 for quick text-to-text tasks."),
 ("google/flan-t5-xl", 500, 300000, "t5,instruction", "en", "Three-billion-parameter Flan-T5; stronger reasoning for text-to-text tasks."),
 ("google-t5/t5-base", 700, 2000000, "t5", "en,fr,ro,de", "Original T5: summarisation, translation English to German, French, Romanian."),
 ("vennify/t5-base-grammar-correction", 170, 200000, "grammar", "en", "Corrects grammar and spelling of English sentences."),
 ("humarin/chatgpt_paraphraser_on_T5_base", 200, 150000, "paraphrase", "en", "Rewrites English sentences as several paraphrases."),
 ("bigscience/T0_3B", 100, 20000, "t0,zero-shot", "en", "T0 prompted multitask model answering natural-language task prompts zero-shot."),
 ("MBZUAI/LaMini-Flan-T5-783M", 80, 20000, "instruction", "en", "Distilled instruction follower built on Flan-T5."),
],
"summarization": [
 ("facebook/bart-large-cnn", 1400, 3000000, "bart,news", "en", "Abstractive summaries of English news articles (CNN/DailyMail)."),
 ("sshleifer/distilbart-cnn-12-6", 300, 1000000, "bart,news", "en", "Distilled BART for fast news summarisation."),
 ("google/pegasus-xsum", 200, 200000, "pegasus", "en", "One-sentence extreme summaries of English articles."),
 ("philschmid/bart-large-cnn-samsum", 270, 100000, "dialogue", "en", "Summarises chat and meeting dialogues."),
 ("google/pegasus-large", 100, 60000, "pegasus", "en", "Pegasus pretrained for abstractive summarisation."),
 ("csebuetnlp/mT5_multilingual_XLSum", 270, 40000, "mt5", "multilingual", "Summaries in 45 languages, trained on BBC XL-Sum."),
 ("pszemraj/led-large-book-summary", 100, 10000, "long-document", "en", "Summarises long documents and book chapters (16k tokens)."),
 ("Falconsai/text_summarization", 200, 100000, "t5", "en", "Small T5 fine-tuned for concise English summaries."),
],
"translation": [
 ("Helsinki-NLP/opus-mt-en-de", 50, 900000, "marian", "en,de", "Translates English to German."),
 ("Helsinki-NLP/opus-mt-de-en", 40, 600000, "marian", "de,en", "Translates German to English."),
 ("Helsinki-NLP/opus-mt-en-fr", 50, 500000, "marian", "en,fr", "Translates English to French."),
 ("Helsinki-NLP/opus-mt-fr-en", 40, 400000, "marian", "fr,en", "Translates French to English."),
 ("Helsinki-NLP/opus-mt-en-zh", 50, 300000, "marian", "en,zh", "Translates English to Chinese."),
 ("Helsinki-NLP/opus-mt-zh-en", 60, 300000, "marian", "zh,en", "Translates Chinese to English."),
 ("Helsinki-NLP/opus-mt-en-es", 80, 400000, "marian", "en,es", "Translates English to Spanish."),
 ("facebook/nllb-200-distilled-600M", 700, 500000, "nllb", "multilingual", "No Language Left Behind: translation between 200 languages."),
 ("facebook/m2m100_418M", 300, 400000, "m2m100", "multilingual", "Many-to-many translation between 100 languages."),
 ("google-t5/t5-small", 400, 3000000, "t5", "en,fr,ro,de", "Tiny T5 translating English to German, French and Romanian."),
],
"question-answering": [
 ("deepset/roberta-base-squad2", 900, 1500000, "extractive-qa,squad", "en", "Extractive question answering over an English passage; can answer 'no answer'."),
 ("distilbert/distilbert-base-cased-distilled-squad", 250, 800000, "extractive-qa,squad", "en", "Fast extractive question answering, SQuAD."),
 ("deepset/deberta-v3-large-squad2", 60, 100000, "extractive-qa,squad", "en", "High-accuracy extractive question answering with DeBERTa v3."),
 ("deepset/xlm-roberta-large-squad2", 60, 100000, "extractive-qa", "multilingual", "Multilingual extractive question answering."),
 ("deepset/gelectra-base-germanquad", 30, 20000, "extractive-qa", "de", "Question answering over German passages (GermanQuAD)."),
 ("timpal0l/mdeberta-v3-base-squad2", 250, 100000, "extractive-qa", "multilingual", "Multilingual DeBERTa extractive question answering in 100 languages."),
 ("google-bert/bert-large-uncased-whole-word-masking-finetuned-squad", 200, 300000, "extractive-qa", "en", "Large BERT fine-tuned on SQuAD for reading comprehension."),
 ("uer/roberta-base-chinese-extractive-qa", 100, 30000, "extractive-qa", "zh", "Chinese extractive question answering."),
],
"conversational": [
 ("facebook/blenderbot-400M-distill", 400, 300000, "chit-chat", "en", "Open-domain chit-chat dialogue agent."),
 ("microsoft/DialoGPT-medium", 350, 300000, "chit-chat,gpt2", "en", "GPT-2 trained on Reddit conversations for casual multi-turn chat."),
 ("microsoft/DialoGPT-large", 270, 100000, "chit-chat,gpt2", "en", "Larger DialoGPT for more fluent casual chat."),
 ("Qwen/Qwen2.5-7B-Instruct", 700, 1500000, "chat,instruct", "multilingual", "Multilingual instruction-tuned chat model, good at reasoning and code."),
 ("meta-llama/Llama-3.1-8B-Instruct", 4000, 5000000, "chat,instruct", "multilingual", "Meta's 8B instruction-tuned chat model with 128k context."),
 ("HuggingFaceTB/SmolLM2-1.7B-Instruct", 600, 300000, "chat,small", "en", "Small, fast instruction-tuned chat model for on-device use."),
],
"text-generation": [
 ("openai-community/gpt2", 2500, 10000000, "gpt2", "en", "Classic GPT-2 for English text continuation."),
 ("Qwen/Qwen2.5-7B-Instruct", 700, 1500000, "chat,instruct", "multilingual", "Instruction-following text generation in many languages."),
 ("meta-llama/Llama-3.1-8B-Instruct", 4000, 5000000, "chat,instruct", "multilingual", "Meta's 8B instruction model for writing, reasoning and code."),
 ("mistralai/Mistral-7B-Instruct-v0.3", 1800, 2000000, "chat,instruct", "en", "Mistral 7B instruction model; strong general writing."),
 ("microsoft/Phi-3-mini-4k-instruct", 1100, 1000000, "chat,small", "en", "3.8B model with strong reasoning for its size."),
 ("EleutherAI/gpt-neo-1.3B", 300, 200000, "gpt-neo", "en", "Open GPT-3 style model for text continuation."),
 ("bigcode/starcoder2-3b", 170, 200000, "code", "code", "Generates and completes source code in 600 programming languages."),
 ("HuggingFaceTB/SmolLM2-360M", 150, 300000, "small", "en", "Tiny language model for quick drafts on the CPU."),
],
"sentence-similarity": [
 ("sentence-transformers/all-MiniLM-L6-v2", 3500, 80000000, "sentence-transformers,embeddings", "en", "Fast English sentence embeddings; cosine similarity of two sentences."),
 ("sentence-transformers/all-mpnet-base-v2", 1100, 20000000, "sentence-transformers,embeddings", "en", "Highest-quality general English sentence embeddings among the classic models."),
 ("sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2", 900, 10000000, "sentence-transformers,multilingual", "multilingual", "Sentence similarity across 50 languages."),
 ("BAAI/bge-small-en-v1.5", 350, 5000000, "embeddings,retrieval", "en", "Small English embedding model for retrieval and similarity."),
 ("BAAI/bge-m3", 2000, 5000000, "embeddings,multilingual", "multilingual", "Multilingual, long-input embeddings for similarity and retrieval."),
 ("intfloat/multilingual-e5-large", 900, 3000000, "embeddings,multilingual", "multilingual", "Multilingual E5 embeddings in 100 languages."),
 ("deutsche-telekom/gbert-large-paraphrase-cosine", 20, 20000, "sentence-transformers", "de", "German sentence similarity and paraphrase detection."),
 ("sentence-transformers/multi-qa-MiniLM-L6-cos-v1", 150, 2000000, "sentence-transformers,qa", "en", "Matches questions to passages that answer them."),
],
"tabular-classification": [
 ("scikit-learn/tabular-playground", 10, 1000, "sklearn,tabular", "", "Gradient-boosted classifier on a tabular playground dataset."),
 ("keras-io/tab_transformer", 20, 1000, "keras,tabular", "", "TabTransformer classifying rows of census income data."),
 ("julien-c/wine-quality", 20, 5000, "sklearn,tabular", "", "Predicts wine quality from chemical measurements."),
 ("osanseviero/titanic_mlconsole", 5, 1000, "sklearn,tabular", "", "Predicts Titanic passenger survival from a row of attributes."),
],
"object-detection": [
 ("facebook/detr-resnet-50", 800, 1000000, "detr,coco", "", "DETR detecting the 80 COCO object classes with boxes and scores."),
 ("facebook/detr-resnet-101", 120, 200000, "detr,coco", "", "Deeper DETR backbone for more accurate COCO object detection."),
 ("hustvl/yolos-tiny", 270, 300000, "yolos,coco", "", "Tiny vision transformer detector; very fast COCO detection."),
 ("hustvl/yolos-small", 60, 100000, "yolos,coco", "", "Small YOLOS detector for COCO objects."),
 ("microsoft/table-transformer-detection", 350, 2000000, "tables,documents", "", "Finds tables in document page images."),
 ("PekingU/rtdetr_r50vd", 60, 200000, "rt-detr,coco", "", "Real-time DETR: fast and accurate COCO detection."),
 ("google/owlvit-base-patch32", 120, 300000, "open-vocabulary", "", "Detects objects named in free text (open vocabulary)."),
 ("IDEA-Research/grounding-dino-tiny", 100, 500000, "open-vocabulary,grounding", "", "Grounding DINO: detects any object described by a phrase."),
 ("keremberke/yolov8m-hard-hat-detection", 20, 10000, "safety", "", "Detects hard hats and heads on construction sites."),
],
"image-classification": [
 ("google/vit-base-patch16-224", 800, 3000000, "vit,imagenet", "", "Vision Transformer classifying photos into 1000 ImageNet categories."),
 ("microsoft/resnet-50", 400, 2000000, "resnet,imagenet", "", "ResNet-50 ImageNet classifier; a robust baseline."),
 ("facebook/convnext-large-224", 30, 100000, "convnext,imagenet", "", "ConvNeXt ImageNet classifier with high accuracy."),
 ("openai/clip-vit-large-patch14", 1700, 10000000, "clip,zero-shot", "", "CLIP: classifies images into any labels given in text."),
 ("microsoft/beit-base-patch16-224", 100, 200000, "beit,imagenet", "", "BEiT ImageNet image classifier."),
 ("nateraw/vit-age-classifier", 140, 600000, "faces,age", "", "Estimates a person's age range from a face photo."),
 ("Falconsai/nsfw_image_detection", 700, 50000000, "moderation", "", "Flags not-safe-for-work images."),
 ("dima806/facial_emotions_image_detection", 80, 300000, "faces,emotion", "", "Recognises facial emotions in face photos."),
 ("google/efficientnet-b7", 20, 20000, "efficientnet,imagenet", "", "EfficientNet-B7 ImageNet classifier."),
 ("timm/mobilenetv3_large_100.ra_in1k", 30, 500000, "mobilenet,imagenet", "", "Light MobileNetV3 ImageNet classifier for fast CPU inference."),
],
"image-to-image": [
 ("timbrooks/instruct-pix2pix", 1000, 100000, "diffusers,editing", "", "Edits an image following a written instruction, e.g. 'make it winter'."),
 ("lambdalabs/sd-image-variations-diffusers", 400, 20000, "diffusers,variations", "", "Creates variations of an input image with Stable Diffusion."),
 ("caidas/swin2SR-classical-sr-x2-64", 20, 100000, "super-resolution", "", "Upscales images 2x with Swin2SR super-resolution."),
 ("stabilityai/stable-diffusion-x4-upscaler", 700, 100000, "diffusers,super-resolution", "", "Upscales images 4x guided by a text prompt."),
 ("keras-io/low-light-image-enhancement", 40, 1000, "enhancement", "", "Brightens and enhances photos taken in low light."),
 ("google/maxim-s3-deblurring-gopro", 10, 1000, "deblurring", "", "Removes motion blur from photos."),
],
"image-to-text": [
 ("Salesforce/blip-image-captioning-large", 1200, 2000000, "blip,captioning", "en", "Writes a detailed English caption for a photo."),
 ("Salesforce/blip-image-captioning-base", 600, 2000000, "blip,captioning", "en", "Writes a short English caption for a photo."),
 ("nlpconnect/vit-gpt2-image-captioning", 900, 1000000, "captioning", "en", "ViT encoder + GPT-2 decoder image captioning."),
 ("microsoft/git-base-coco", 100, 50000, "git,captioning", "en", "Generative image-to-text transformer captioning COCO-style."),
 ("Salesforce/blip2-opt-2.7b", 400, 500000, "blip2,captioning", "en", "BLIP-2 captions and describes images in depth."),
 ("microsoft/trocr-base-printed", 200, 300000, "ocr", "en", "Reads printed text in an image line (OCR)."),
 ("microsoft/trocr-base-handwritten", 400, 300000, "ocr,handwriting", "en", "Reads handwritten text in an image line."),
 ("microsoft/Florence-2-large", 1500, 1000000, "captioning,ocr", "en", "Florence-2: captions, OCR and grounding from one model."),
],
"text-to-image": [
 ("stable-diffusion-v1-5/stable-diffusion-v1-5", 500, 2000000, "diffusers,stable-diffusion", "en", "Stable Diffusion 1.5: general text-to-image at 512px."),
 ("stabilityai/stable-diffusion-xl-base-1.0", 6500, 3000000, "diffusers,sdxl", "en", "SDXL: high-quality 1024px images from text."),
 ("stabilityai/stable-diffusion-2-1", 4000, 500000, "diffusers,stable-diffusion", "en", "Stable Diffusion 2.1 at 768px."),
 ("stabilityai/sdxl-turbo", 2400, 500000, "diffusers,fast", "en", "SDXL Turbo: images in a single denoising step."),
 ("black-forest-labs/FLUX.1-schnell", 4000, 1000000, "diffusers,flux,fast", "en", "FLUX.1 schnell: fast, prompt-faithful image generation."),
 ("prompthero/openjourney", 3000, 50000, "diffusers,artistic", "en", "Midjourney-style artistic images."),
 ("dreamlike-art/dreamlike-photoreal-2.0", 1700, 30000, "diffusers,photoreal", "en", "Photorealistic images from text."),
 ("segmind/SSD-1B", 800, 20000, "diffusers,distilled", "en", "Distilled SDXL, 60% faster."),
],
"text-to-video": [
 ("damo-vilab/text-to-video-ms-1.7b", 600, 50000, "diffusers,video", "en", "ModelScope text-to-video: short clips from a sentence."),
 ("cerspense/zeroscope_v2_576w", 500, 20000, "diffusers,video", "en", "Zeroscope: watermark-free 576px short videos."),
 ("ali-vilab/text-to-video-ms-1.7b", 100, 10000, "diffusers,video", "en", "ModelScope text-to-video, mirrored weights."),
 ("ByteDance/AnimateDiff-Lightning", 900, 50000, "diffusers,animation", "en", "Animated clips from text in a few steps."),
],
"visual-question-answering": [
 ("dandelin/vilt-b32-finetuned-vqa", 400, 300000, "vilt,vqa", "en", "Answers short questions about an image (VQAv2)."),
 ("Salesforce/blip-vqa-base", 150, 300000, "blip,vqa", "en", "BLIP answering questions about photos."),
 ("Salesforce/blip-vqa-capfilt-large", 50, 50000, "blip,vqa", "en", "Larger BLIP for visual question answering."),
 ("microsoft/git-base-vqav2", 20, 10000, "git,vqa", "en", "GIT fine-tuned for visual question answering."),
 ("google/paligemma-3b-mix-224", 100, 50000, "paligemma,vqa", "multilingual", "PaliGemma answering questions about images in many languages."),
],
"document-question-answering": [
 ("impira/layoutlm-document-qa", 1000, 100000, "layoutlm,documents", "en", "Answers questions about scanned documents and invoices."),
 ("impira/layoutlm-invoices", 200, 20000, "layoutlm,invoices", "en", "Extracts answers from invoices: totals, dates, vendors."),
 ("naver-clova-ix/donut-base-finetuned-docvqa", 200, 50000, "donut,ocr-free", "en", "OCR-free document question answering with Donut."),
 ("tiennvcs/layoutlmv2-base-uncased-finetuned-docvqa", 20, 5000, "layoutlmv2", "en", "LayoutLMv2 for document question answering."),
],
"image-segmentation": [
 ("facebook/detr-resnet-50-panoptic", 140, 100000, "detr,panoptic,coco", "", "Panoptic segmentation of COCO scenes: things and stuff."),
 ("nvidia/segformer-b0-finetuned-ade-512-512", 150, 500000, "segformer,ade20k", "", "Fast semantic segmentation of 150 ADE20K scene classes."),
 ("nvidia/segformer-b5-finetuned-ade-640-640", 40, 50000, "segformer,ade20k", "", "Accurate semantic segmentation of indoor and outdoor scenes."),
 ("facebook/mask2former-swin-large-coco-panoptic", 50, 50000, "mask2former,panoptic", "", "Mask2Former panoptic segmentation of COCO."),
 ("facebook/maskformer-swin-base-coco", 20, 50000, "maskformer", "", "MaskFormer panoptic segmentation."),
 ("mattmdjaga/segformer_b2_clothes", 400, 300000, "clothes,fashion", "", "Segments clothes and body parts in photos of people."),
 ("briaai/RMBG-1.4", 1800, 500000, "background-removal", "", "Removes the background from photos."),
 ("CIDAS/clipseg-rd64-refined", 120, 1000000, "clipseg,text-prompted", "", "Segments whatever a text prompt describes."),
],
"depth-estimation": [
 ("Intel/dpt-large", 180, 300000, "dpt,monocular", "", "DPT monocular depth map from a single photo."),
 ("Intel/dpt-hybrid-midas", 90, 300000, "dpt,midas", "", "MiDaS hybrid depth estimation from one image."),
 ("LiheYang/depth-anything-large-hf", 60, 100000, "depth-anything", "", "Depth Anything: robust relative depth for any photo."),
 ("depth-anything/Depth-Anything-V2-Small-hf", 100, 500000, "depth-anything", "", "Depth Anything V2 small: fast depth maps."),
 ("vinvino02/glpn-nyu", 20, 100000, "glpn,indoor", "", "GLPN indoor depth estimation trained on NYU Depth."),
 ("Intel/zoedepth-nyu-kitti", 20, 20000, "zoedepth,metric", "", "ZoeDepth metric depth in meters."),
],
"text-to-speech": [
 ("microsoft/speecht5_tts", 700, 300000, "speecht5", "en", "SpeechT5 English text-to-speech with speaker embeddings."),
 ("espnet/kan-bayashi_ljspeech_vits", 200, 10000, "vits,espnet", "en", "VITS voice trained on LJSpeech, clear female English voice."),
 ("facebook/mms-tts-eng", 200, 200000, "vits,mms", "en", "Massively multilingual speech: English VITS voice."),
 ("facebook/mms-tts-deu", 20, 20000, "vits,mms", "de", "MMS VITS voice speaking German."),
 ("suno/bark-small", 200, 100000, "bark", "multilingual", "Bark: expressive multilingual speech, laughter and music."),
 ("facebook/fastspeech2-en-ljspeech", 300, 5000, "fastspeech2", "en", "FastSpeech 2 English voice."),
 ("parler-tts/parler-tts-mini-v1", 400, 50000, "parler", "en", "Speech whose voice is described in text (pitch, pace, tone)."),
 ("hexgrad/Kokoro-82M", 4500, 2000000, "kokoro", "en", "Small high-quality English voice model."),
],
"automatic-speech-recognition": [
 ("openai/whisper-large-v3", 4500, 5000000, "whisper", "multilingual", "Whisper large v3: transcribes and translates speech in 99 languages."),
 ("openai/whisper-base", 300, 1000000, "whisper", "multilingual", "Small, fast multilingual Whisper transcription."),
 ("openai/whisper-small", 300, 1000000, "whisper", "multilingual", "Whisper small: good accuracy at low cost."),
 ("openai/whisper-large-v3-turbo", 2000, 3000000, "whisper,fast", "multilingual", "Whisper v3 turbo: near large-v3 accuracy, much faster."),
 ("facebook/wav2vec2-base-960h", 300, 1000000, "wav2vec2", "en", "wav2vec 2.0 English speech recognition on LibriSpeech."),
 ("facebook/wav2vec2-large-960h-lv60-self", 100, 300000, "wav2vec2", "en", "Larger wav2vec 2.0 English transcription."),
 ("jonatasgrosman/wav2vec2-large-xlsr-53-german", 30, 200000, "wav2vec2", "de", "Transcribes German speech."),
 ("distil-whisper/distil-large-v3", 300, 300000, "whisper,distilled", "en", "Distilled Whisper, 6x faster English transcription."),
],
"audio-to-audio": [
 ("speechbrain/sepformer-wham", 20, 5000, "speechbrain,separation", "en", "Separates two overlapping speakers in noisy audio."),
 ("speechbrain/metricgan-plus-voicebank", 60, 10000, "speechbrain,enhancement", "en", "Removes noise from speech recordings."),
 ("JorisCos/DCCRNet_Libri1Mix_enhsingle_16k", 20, 1000, "asteroid,enhancement", "en", "Speech enhancement of single-speaker noisy audio."),
 ("microsoft/speecht5_vc", 100, 10000, "speecht5,voice-conversion", "en", "Converts one speaker's voice into another's."),
 ("facebook/demucs", 20, 1000, "music,separation", "", "Separates music into vocals, drums, bass and other."),
],
"audio-classification": [
 ("MIT/ast-finetuned-audioset-10-10-0.4593", 300, 1000000, "ast,audioset", "", "Audio Spectrogram Transformer tagging 527 AudioSet sound classes."),
 ("superb/hubert-large-superb-er", 30, 50000, "hubert,emotion", "en", "Emotion recognition from speech."),
 ("ehcalabres/wav2vec2-lg-xlsr-en-speech-emotion-recognition", 200, 100000, "emotion", "en", "Recognises emotion in English speech."),
 ("superb/wav2vec2-base-superb-ks", 20, 50000, "keyword-spotting", "en", "Spots spoken keywords (Speech Commands)."),
 ("speechbrain/lang-id-voxlingua107-ecapa", 100, 100000, "speechbrain,language-id", "multilingual", "Identifies the spoken language among 107."),
 ("facebook/mms-lid-126", 40, 50000, "mms,language-id", "multilingual", "Spoken language identification for 126 languages."),
 ("dima806/music_genres_classification", 40, 20000, "music,genre", "", "Classifies the genre of a music clip."),
],
}

SD15 = "stable-diffusion-v1-5/stable-diffusion-v1-5"
CONTROLS = ("canny", "depth", "hed", "mlsd", "normal", "openpose", "seg")

# ControlNet models and annotators: picked by JARVIS's fixed rules, not ranked, but served locally.
M["canny-control"] = [("canny-control", 0, 0, "controlnet,annotator,edges", "",
                       "Canny edge map of an image, the control input for ControlNet canny.")]
M["normal-control"] = [("normal-control", 0, 0, "controlnet,annotator,normal", "",
                        "Surface-normal map of an image, from a DPT depth estimate: the control input for ControlNet "
                        "normal.")]
for _c, _what in (("hed", "soft HED edge map"), ("mlsd", "straight-line (M-LSD) map"),
                  ("openpose", "OpenPose body skeleton")):
    M[f"{_c}-control"] = [(f"{_c}-control", 0, 0, f"controlnet,annotator,{_c}", "",
                           f"The {_what} of an image (controlnet_aux), the control input for ControlNet {_c}.")]
for _c in CONTROLS:
    M[f"{_c}-text-to-image"] = [(f"lllyasviel/sd-controlnet-{_c}", 0, 0, f"controlnet,{_c}", "en",
                                 f"ControlNet on Stable Diffusion 1.5 conditioned on a {_c} map.")]

# How the local models server loads a model: id -> (loader, level, pipeline task or None).
# Some need a second model beside them (BASE_MODEL): ControlNets plug into SD 1.5, SpeechT5 speaks through HiFi-GAN.
# Levels as in JARVIS: minimal (annotators, light models) < standard (common pipelines) < full (generation).
LOCAL = {
    "canny-control": ("annotator", "minimal", None),
    "normal-control": ("depth-normals", "minimal", None),
    **{f"{c}-control": ("controlnet-aux", "minimal", None) for c in ("hed", "mlsd", "openpose")},
    "sentence-transformers/all-MiniLM-L6-v2": ("sentence-embedding", "minimal", None),
    "distilbert/distilbert-base-uncased-finetuned-sst-2-english": ("pipeline", "standard", "text-classification"),
    "cardiffnlp/twitter-roberta-base-sentiment-latest": ("pipeline", "standard", "text-classification"),
    "dslim/bert-base-NER": ("pipeline", "standard", "token-classification"),
    "flair/ner-german": ("pipeline", "standard", "token-classification"),
    "fhswf/bert_de_ner": ("pipeline", "standard", "token-classification"),
    "deepset/roberta-base-squad2": ("extractive-qa", "standard", None),
    "distilbert/distilbert-base-cased-distilled-squad": ("extractive-qa", "standard", None),
    "facebook/bart-large-cnn": ("seq2seq", "standard", None),
    "sshleifer/distilbart-cnn-12-6": ("seq2seq", "standard", None),
    "Helsinki-NLP/opus-mt-en-de": ("seq2seq", "standard", None),
    "Helsinki-NLP/opus-mt-en-fr": ("seq2seq", "standard", None),
    "google/flan-t5-base": ("seq2seq", "standard", None),
    "openai-community/gpt2": ("pipeline", "standard", "text-generation"),
    "microsoft/DialoGPT-medium": ("pipeline", "standard", "text-generation"),
    "sentence-transformers/all-mpnet-base-v2": ("pipeline", "standard", "feature-extraction"),
    "google/vit-base-patch16-224": ("pipeline", "standard", "image-classification"),
    "microsoft/resnet-50": ("pipeline", "standard", "image-classification"),
    "facebook/detr-resnet-50": ("pipeline", "standard", "object-detection"),
    "hustvl/yolos-tiny": ("pipeline", "standard", "object-detection"),
    "nvidia/segformer-b0-finetuned-ade-512-512": ("pipeline", "standard", "image-segmentation"),
    "facebook/detr-resnet-50-panoptic": ("pipeline", "standard", "image-segmentation"),
    "Intel/dpt-large": ("pipeline", "standard", "depth-estimation"),
    "Intel/dpt-hybrid-midas": ("pipeline", "standard", "depth-estimation"),
    "nlpconnect/vit-gpt2-image-captioning": ("vision2seq", "standard", None),
    "Salesforce/blip-image-captioning-large": ("vision2seq", "standard", None),
    "dandelin/vilt-b32-finetuned-vqa": ("vqa", "standard", None),
    "impira/layoutlm-document-qa": ("pipeline", "standard", "document-question-answering"),
    "openai/whisper-base": ("pipeline", "standard", "automatic-speech-recognition"),
    "facebook/wav2vec2-base-960h": ("pipeline", "standard", "automatic-speech-recognition"),
    "MIT/ast-finetuned-audioset-10-10-0.4593": ("pipeline", "standard", "audio-classification"),
    "microsoft/speecht5_tts": ("pipeline", "standard", "text-to-audio"),
    "facebook/mms-tts-eng": ("pipeline", "standard", "text-to-audio"),
    SD15: ("diffusers", "full", None),
    "stabilityai/stable-diffusion-xl-base-1.0": ("diffusers", "full", None),
    "timbrooks/instruct-pix2pix": ("diffusers", "full", None),
    "damo-vilab/text-to-video-ms-1.7b": ("diffusers", "full", None),
    "microsoft/speecht5_vc": ("speecht5-vc", "full", None),
    **{f"lllyasviel/sd-controlnet-{c}": ("controlnet", "full", None) for c in CONTROLS},
}


BASE_MODEL = {"controlnet": SD15, "speecht5-vc": "microsoft/speecht5_hifigan"}
# Annotators that run another model's weights (read from that model's folder, fetched under its id).
WEIGHTS_FROM = {"normal-control": "Intel/dpt-hybrid-midas",
                **{f"{c}-control": "lllyasviel/Annotators" for c in ("hed", "mlsd", "openpose")}}
# ...and of such a repository only these files (lllyasviel/Annotators holds every annotator's checkpoints).
FILES = {"hed-control": ["ControlNetHED.pth"], "mlsd-control": ["mlsd_large_512_fp32.pth"],
         "openpose-control": ["body_pose_model.pth", "hand_pose_model.pth", "facenet.pth"]}


def build_rows() -> list[dict]:
    rows, seen = [], set()
    for task, items in M.items():
        for mid, likes, downloads, tags, lang, desc in items:
            if mid in seen:  # one row per model id: the first task listed is the one it is known for
                continue
            seen.add(mid)
            row = {"id": mid, "task": task, "likes": likes, "downloads": downloads,
                   "tags": [t for t in tags.split(",") if t], "language": [x for x in lang.split(",") if x],
                   "description": desc}
            if mid in LOCAL:
                loader, level, pipeline_task = LOCAL[mid]
                local = {"loader": loader, "level": level}
                if pipeline_task:
                    local["pipeline_task"] = pipeline_task
                if loader in BASE_MODEL:
                    local["base_model"] = BASE_MODEL[loader]
                if loader == "annotator":
                    local["needs_weights"] = False
                if mid in WEIGHTS_FROM:
                    local["weights_from"] = WEIGHTS_FROM[mid]
                if mid in FILES:
                    local["files"] = FILES[mid]
                row["local"] = local
            rows.append(row)
    missing = sorted(set(LOCAL) - seen)
    if missing:
        raise SystemExit(f"LOCAL names models with no catalog row: {', '.join(missing)}")
    return rows


def sync_main(argv) -> int:
    """`sync`: the Hub's models into the store the config names (resumable, incremental)."""
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    from hugginggpt.catalog.hub_api import HubClient
    from hugginggpt.catalog.store import open_store
    from hugginggpt.catalog.sync import HUB_TASKS, Progress, sync
    from hugginggpt.config import load_config
    from hugginggpt.errors import ConfigError

    parser = argparse.ArgumentParser(prog="build_catalog.py sync", description=(
        "Fill the catalog store (config key catalog_store) with the Hub's models, per pipeline tag, most downloaded "
        "first. Interrupted (Ctrl-C, network), it continues where it stopped; run again, it fetches only what "
        "changed. The Hub is HF_ENDPOINT (or catalog_sync.endpoint); the token huggingface.token or HF_TOKEN."))
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--per-task", type=int, default=None, help="the most downloaded N per task (default: all)")
    parser.add_argument("--tasks", nargs="+", default=None, help="pipeline tags (default: every planner task)")
    parser.add_argument("--full", action="store_true", help="list everything again (refreshes downloads and likes)")
    parser.add_argument("--page-size", type=int, default=1000)
    parser.add_argument("--retries", type=int, default=5, help="retries per request on network errors and 5xx")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, need_llm=False)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tasks = args.tasks or list(config.catalog_sync_tasks) or list(HUB_TASKS)
    per_task = args.per_task or config.catalog_sync_per_task
    store = open_store(config)
    client = HubClient(endpoint=config.catalog_endpoint, token=config.huggingface_token, max_retries=args.retries)
    print(f"syncing {len(tasks)} task(s) from {client.endpoint} into {store.path} "
          f"({'all' if per_task is None else per_task} per task, embedder {store.meta('embedder')})", file=sys.stderr)
    try:
        report = sync(store, client, tasks, per_task=per_task, full=args.full, page_size=args.page_size,
                      progress=Progress())
    except KeyboardInterrupt:
        print("interrupted: what was fetched is kept; run the same command again to continue", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - network or Hub error: the store keeps every finished page
        print(f"error: {exc.__class__.__name__}: {exc}\nwhat was fetched is kept; run again to continue",
              file=sys.stderr)
        return 1
    print(f"{report.fetched} cards fetched in {report.seconds:.1f}s ({report.rate:.0f} cards/s); the store holds "
          f"{store.count()} models in {len(store.tasks())} tasks", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sync"]:
        return sync_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is out of date")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data" / "p0_models.jsonl")
    args = parser.parse_args(argv)
    rows = build_rows()
    text = "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n"
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is out of date: run python tools/build_catalog.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date ({len(rows)} models)")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"{len(rows)} models, {len({r['task'] for r in rows})} tasks, {sum('local' in r for r in rows)} served "
          f"locally -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
