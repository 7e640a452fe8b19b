"""A small local LLM on llama.cpp: its weights (weights.py) and its server (server.py), set up by one command
(tools/local_llm.py, `make llm`)."""
