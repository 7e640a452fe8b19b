"""HuggingGPT server: an LLM plans a request as a graph of AI tasks, models run them, the LLM answers.

Importing this package reads no config, opens no socket and loads no model.
"""

__version__ = "0.1.0"
