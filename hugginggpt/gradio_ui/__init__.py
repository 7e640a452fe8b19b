"""The Gradio app (`run_gradio_demo.py`, `spaces/app.py`).

- `orchestrators.py`: one small interface, two implementations: the engine in this process, or a running
  orchestrator over HTTP (SSE). The UI code is the same for both.
- `progress.py`: the orchestrator's events turned into a plan table and readable task outputs.
- `app.py`: the Blocks UI; per-visitor state lives in the session, never in module globals.
- `launch.py`: the command line, the offline demo stack when no LLM is configured, start-up.
"""
