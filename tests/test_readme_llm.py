"""The README's LLM quick start runs as written (tests/test_readme.py's terminal: a fresh copy of the
repository, one bash typed into line by line in a network namespace of its own). A module of its own
because it starts a real vLLM engine: the suite runs such modules one after another
(tests/support/parallel.py)."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.support.ci import cannot_run
from tests.support.terminal import (REPO, Shell, command_lines, fresh_clone, netns_works, section_blocks, step,
                                    taken_ports, user_env, venv_is_current)
from tests.test_readme import README, probe


# --- the LLM quick start ------------------------------------------------------------------------

def llm_quick_start() -> list[str]:
    (block,) = section_blocks(README.read_text(), "LLM quick start", "bash")
    return command_lines(block)


def greedy_text(folder: Path, ids: list[int], n: int) -> str:
    from transformers import AutoTokenizer

    from serving.testmodels_llm import greedy_reference

    return AutoTokenizer.from_pretrained(str(folder)).decode(greedy_reference(folder, ids, n))


def same_text(got: str, decoded: str) -> bool:
    """Equal, but for a last character whose bytes are incomplete: vLLM holds those back, a decode shows U+FFFD."""
    return got == decoded or (decoded.endswith("\ufffd") and bool(got) and decoded.startswith(got))


@pytest.mark.timeout(1500)
def test_the_llm_quick_start_runs_as_written(tmp_path):
    """Set up, export the tiny Llama, `serving up` (its launcher starts the vLLM engine on `model add`),
    upload the folder, deploy with --wait, then the `openai` client's chat answer and curl's stream: each
    equal to transformers' greedy generate on the same model and prompt."""
    if not venv_is_current():
        cannot_run("the .venv was installed for another pyproject.toml or scripts/setup.sh: run `make setup`")
    if not (REPO / ".venv-vllm" / "bin" / "python").exists():
        cannot_run("no .venv-vllm (make setup installs vLLM's venv)")
    netns = netns_works()
    if not netns and taken_ports():
        cannot_run(f"no network namespace here (unshare --net), and the quick start's ports {taken_ports()} are taken")
    clone = fresh_clone(tmp_path / "clone")
    env = user_env(tmp_path)
    shell = Shell(clone, env, tmp_path / "terminal.log", netns)
    try:
        it = iter(llm_quick_start())
        step(shell, next(it), timeout=600)  # make setup && source .venv/bin/activate
        export = next(it)
        step(shell, export, timeout=300)
        folder = clone / shlex.split(export.split("#")[0])[3]
        assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
        up = next(it)
        assert up.split("#")[0].strip().endswith("&")
        step(shell, up)
        assert probe(shell, "wait_ok", urls=["http://127.0.0.1:8080/health", "http://127.0.0.1:9090/v2/health/live"],
                     timeout=240)["ok"], f"the stack did not come up:\n{shell.tail()}"
        assert "registered tiny-llm:1" in " ".join(step(shell, next(it)).split())
        add = next(it)
        assert "--wait" in add.split()
        step(shell, add, timeout=600)  # the engine's start (about 45 s; compiling on a first run)

        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        chat = next(it)
        assert chat.startswith("python -c ") and "max_tokens=8" in chat
        out = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
        ids = list(out["input_ids"] if hasattr(out, "keys") else out)
        answer = step(shell, chat)
        assert same_text(answer[:-1] if answer.endswith("\n") else answer, greedy_text(folder, ids, 8)), answer

        curl = next(it)
        request = json.loads(shlex.split(curl)[shlex.split(curl).index("-d") + 1])
        events = [line[len("data: "):] for line in step(shell, curl).splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and len(events) > 2, events
        text = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
        want = greedy_text(folder, tokenizer(request["prompt"])["input_ids"], request["max_tokens"])
        assert same_text(text, want), (text, want)
        assert next(it, None) is None, "an LLM quick start line this test does not check"
    finally:
        shell.close()
