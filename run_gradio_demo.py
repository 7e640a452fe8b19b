"""The Gradio app (JARVIS's `run_gradio_demo.py`): see hugginggpt/gradio_ui/launch.py for the options.

    python run_gradio_demo.py --config configs/config.gradio.yaml --port 7860
    python run_gradio_demo.py --server http://localhost:8004 --token T
"""

from __future__ import annotations

import sys

from hugginggpt.gradio_ui.launch import main

if __name__ == "__main__":
    sys.exit(main())
