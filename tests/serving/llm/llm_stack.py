"""The LoRA tests' stack: a control plane, the LLM launcher and one worker on real vLLM, statistics off."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from serving.settings import LLMSettings
from tests.serving.stack import Stack, make_stack
from tests.support.ci import cannot_run


@contextmanager
def llm_stack(root: Path) -> Iterator[Stack]:
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    stack = make_stack(root / "home", workers=1)
    stack.env |= {"SERVING_STATISTICS_ENABLED": "false"}
    try:
        stack.start_control_plane()
        stack.start_llm()
        stack.start_worker(0)
        yield stack
    finally:
        stack.stop_all()
