"""The `serving` command lines the deployment docs and NOTES.txt tell users to type exist."""
from __future__ import annotations

import re
import shlex

import pytest

from tests.deploy.artifacts import REPO, rendered_files

DOCS = ["docs/deploy-compose.md", "docs/deploy-helm.md", "docs/llm-engine.md", "docs/llm-statistics.md",
        "docs/llm-rollouts.md", "docs/llm-routing.md", "docs/llm-lora.md",
        "docs/embeddings.md", "docs/torchserve.md"]


def command_lines(text: str) -> list[str]:
    text = text.replace("\\\n", " ")
    return [m.group(1) for m in re.finditer(r"^\s*(serving\s.+)$", text, flags=re.MULTILINE)]


def check(line: str) -> None:
    import typer.main

    from serving.cli.main import app

    command = typer.main.get_command(app)  # typer vendors click: duck-type groups
    words = shlex.split(line.split("#")[0])[1:]
    options = {o for p in command.params for o in p.opts}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            assert word.split("=")[0] in options, f"{line}: no option {word}"
            param = next(p for p in command.params if word.split("=")[0] in p.opts)
            i += 1 if getattr(param, "is_flag", False) or "=" in word else 2
            continue
        if hasattr(command, "commands"):
            assert word in command.commands, f"{line}: no command {word!r}"
            command = command.commands[word]
            options = {o for p in command.params for o in p.opts}
        i += 1
    assert not hasattr(command, "commands"), f"{line}: incomplete command"


def test_check_rejects_a_wrong_command():
    with pytest.raises(AssertionError):
        check("serving model uplaod --name x --path y")
    with pytest.raises(AssertionError):
        check("serving model upload --nmae x --path y")


@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_exist(doc):
    lines = command_lines((REPO / doc).read_text())
    assert len(lines) >= 2
    for line in lines:
        check(line)


def test_notes_commands_exist():
    for line in command_lines(rendered_files("default")["serving/templates/NOTES.txt"]):
        check(line)
