"""Where a local plan's seconds go: three short requests sent straight to the config's local LLM with the
planner's own prompt (its fixed prefix, demos and grammar), with and without the plan grammar, twice each, so
the first call (the whole prefix evaluated) and the later ones (the prompt cache serving it) show apart.

    python tools/local_llm.py &
    python bench/local_plan_seconds.py [--config configs/config.llama.yaml]

Prints, per call: grammar on or off, seconds, prompt and completion tokens, and the start of the reply.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hugginggpt.config import load_config  # noqa: E402
from hugginggpt.plan import plan_json_schema  # noqa: E402
from hugginggpt.planner import plan_token_cap  # noqa: E402
from hugginggpt.prompts import PromptSet  # noqa: E402

REQUESTS = ("I have a recording example.wav, please transcribe it.",
            "Describe example.jpg and read the description aloud.",
            "Translate 'good morning, friends' into French and then make a picture of it.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/config.llama.yaml")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    prompts = PromptSet.from_config(config)
    url = config.llm.endpoint.rstrip("/") + "/chat/completions"
    schema = plan_json_schema(strict=False, max_tasks=config.max_tasks)
    for grammar in (True, False, True):
        for text in REQUESTS:
            body = {"model": config.llm.model, "messages": prompts.parse_task([], text, config.llm.model, 8192),
                    "max_tokens": config.planner_max_tokens or plan_token_cap(config.max_tasks), "temperature": 0}
            if grammar:
                body["response_format"] = {"type": "json_object", "schema": schema}
            started = time.perf_counter()
            reply = requests.post(url, json=body, timeout=600).json()
            usage = reply["usage"]
            print(f"grammar {'on ' if grammar else 'off'} {time.perf_counter() - started:6.2f} s  prompt "
                  f"{usage['prompt_tokens']:5d}  completion {usage['completion_tokens']:4d}  "
                  f"{reply['choices'][0]['message']['content'][:70]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
