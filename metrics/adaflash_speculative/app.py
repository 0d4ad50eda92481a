"""The metric's Hugging Face Space: evaluate's standard widget (a table of generations in, the scores out)."""

from pathlib import Path

import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load(str(Path(__file__).with_name("adaflash_speculative.py")))
launch_gradio_widget(module)
