"""Record a real small LLM's replies for the answer stage, once, as test fixtures
(tests/fixtures/small_llm_replies.json): what it writes from a results log with files and with a failure.

    python tools/local_llm.py &      # the LLM the fixtures come from
    python bench/record_replies.py --config configs/config.llama.yaml

Each case is a request and its results log, sent through the config's response prompt and demos with the
answer stage's token cap, exactly as `respond.write_answer` sends them; the raw reply is stored beside them,
so the tests replay what the model really wrote (tests/test_small_llm_replies.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CASES = [
    {"name": "files", "request": "Draw a lighthouse at night and read the word 'hello' aloud.",
     "results": {"0": {"task": {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a lighthouse at night"}},
                       "inference result": {"generated image": "/images/5f2a9c.png"},
                       "choose model result": {"id": "stable-diffusion-v1-5/stable-diffusion-v1-5", "reason": "local"}},
                 "1": {"task": {"task": "text-to-speech", "id": 1, "dep": [-1], "args": {"text": "hello"}},
                       "inference result": {"generated audio": "/audios/0b7e41.wav"},
                       "choose model result": {"id": "espnet/kan-bayashi_ljspeech_vits", "reason": "local"}}}},
    {"name": "failed", "request": "What is in /examples/chelsea.jpg? Then read the caption aloud.",
     "results": {"0": {"task": {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/chelsea.jpg"}},
                       "inference result": {"error": {"message": "every candidate failed: nlpconnect/vit-gpt2-image-"
                                                                 "captioning: CUDA out of memory"}},
                       "choose model result": {"id": "nlpconnect/vit-gpt2-image-captioning", "reason": "local"}},
                 "1": {"task": {"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}},
                       "inference result": {"error": {"message": "skipped: task 0, which it needs, failed"}},
                       "choose model result": ""}}},
]


def main(argv: list[str] | None = None) -> int:
    from hugginggpt.config import load_config
    from hugginggpt.llm import LLMClient, stage_cap
    from hugginggpt.prompts import PromptSet

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/config.llama.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "small_llm_replies.json")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    llm = LLMClient(config.llm)
    prompts = PromptSet.from_config(config)
    recorded = []
    for case in CASES:
        results = {int(k): v for k, v in case["results"].items()}
        messages = prompts.response_results(case["request"], [results[k] for k in sorted(results)])
        reply = llm.chat(messages, max_tokens=stage_cap(config.llm, "answer"))
        recorded.append({**case, "reply": reply})
        print(f"--- {case['name']}\n{reply}\n", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": config.llm.model, "cases": recorded}, indent=1, ensure_ascii=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
