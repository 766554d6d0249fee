"""The playground's streaming chat (registry/console/chat.py, static/chat.js) against a real vLLM.

`serving up` (control plane, statistics, the LLM launcher, one worker; client keys required) with
the tiny random-weight Llama of serving/testmodels_llm behind endpoint ``chat`` (engine vllm: one
engine start for the module, about 40 s). In Debian's chromium: the chat without a key shows the
worker's 401; with the key, each answer streams in over several chunks and equals what the data
plane answers for the same conversation (greedy, temperature 0) and what transformers' greedy
``generate`` makes of the chat template, with the version that answered.
"""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from serving.settings import LLMSettings
from serving.testmodels_llm import build_tiny_llama, chat_prompt_ids, greedy_reference, same_text
from tests.serving.stack import make_stack
from tests.support import auth
from tests.support.browser import axe_violations, chromium, shown, sign_in, tab_walk
from tests.support.ci import cannot_run
from tests.support.procs import wait_until

EP = "chat"
CONTEXT = 512
MAX_TOKENS = 16
START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("console-llm")
    bundle = build_tiny_llama(root / "tiny-llama", max_model_len=CONTEXT)
    stack = make_stack(root / "home", workers=1)
    stack.env["SERVING_CLIENT_KEYS_REQUIRED"] = "true"
    try:
        stack.up(1, "--no-triton")
        stack.cli("model", "upload", "--name", "tiny-llama", "--path", str(bundle.path))
        key = stack.cli("key", "create", "--name", "console-chat").stdout.strip()
        stack.cli("model", "add", "--engine", "vllm", "--endpoint", EP, "--model", "tiny-llama:1",
                  "--aux-config", f"max_model_len={CONTEXT}", "--wait", "--wait-timeout", str(START_S),
                  timeout=START_S + 60)
        yield {"stack": stack, "key": key, "model": bundle.path}
    finally:
        stack.stop_all()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    given = os.environ.get("SERVING_CONSOLE_SHOTS")
    where = Path(given) if given else tmp_path_factory.mktemp("console-llm-screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def send(browser, message: str) -> dict:
    """Type a message, send it by keyboard, wait for the stream's end: what the page shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = browser.find_element(By.ID, "chat-input")
    field.send_keys(message)
    browser.find_element(By.ID, "chat-send").send_keys(Keys.ENTER)
    last = "[...document.querySelectorAll('.chat-log .msg span')].pop()"  # the answer's element
    wait_until(lambda: browser.execute_script(f"return {last}.dataset.done === '1' && "
                                              "!document.getElementById('chat-send').disabled"),
               timeout=60, what="the streamed answer's end",
               on_timeout=lambda: browser.find_element(By.TAG_NAME, "main").text[:2000])
    shows = browser.execute_script(f"const s = {last}; return {{id: s.id, text: s.textContent, "
                                   "chunks: Number(s.dataset.chunks || 0)};")
    return {**shows, "version": browser.find_element(By.ID, "chat-version").text}


def test_the_chat_streams_the_data_planes_answer(llm, shots):
    from selenium.webdriver.common.by import By
    from transformers import AutoTokenizer

    stack, key = llm["stack"], llm["key"]
    url = f"{stack.control_plane}/console"
    with chromium() as browser:
        sign_in(browser, url, auth.token(stack.home))
        browser.get(f"{url}/playground?endpoint={EP}")
        assert not browser.find_elements(By.ID, "send")  # the chat, not the one-request form
        refused = send(browser, "hello")  # no key: the worker's own 401, in OpenAI's words
        assert refused["id"] == "chat-error" and refused["text"].startswith("401: "), refused
        browser.find_element(By.ID, "chat-max-tokens").clear()
        browser.find_element(By.ID, "chat-max-tokens").send_keys(str(MAX_TOKENS))
        browser.find_element(By.ID, "key").send_keys(key)

        conversation: list[dict] = []
        tokenizer = AutoTokenizer.from_pretrained(str(llm["model"]))
        for message in ("tell me about canary releases", "and rollbacks"):
            conversation.append({"role": "user", "content": message})
            streamed = send(browser, message)
            direct = httpx.post(f"{stack.worker_url()}/serve/openai/v1/chat/completions", timeout=60,
                                headers={"Authorization": f"Bearer {key}"},
                                json={"model": EP, "messages": conversation, "max_tokens": MAX_TOKENS,
                                      "temperature": 0})
            assert direct.status_code == 200, direct.text
            answer = direct.json()["choices"][0]["message"]["content"]
            assert streamed["id"] == "chat-answer" and streamed["text"] == answer, (streamed, answer)
            assert streamed["chunks"] > 1, streamed  # token by token, not one buffered answer
            assert streamed["version"] == direct.headers["X-Model-Version"] == "1"
            want = greedy_reference(llm["model"], chat_prompt_ids(tokenizer, conversation), MAX_TOKENS)
            assert same_text(streamed["text"], tokenizer.decode(want)), (streamed["text"], tokenizer.decode(want))
            conversation.append({"role": "assistant", "content": answer})
        shown(browser, "chat-state", "Answered in")
        browser.save_screenshot(str(shots / "playground-chat.png"))
        assert axe_violations(browser) == []
        reached, focusable = tab_walk(browser)  # the chat page by keyboard too
        assert [f for f in focusable if f not in reached] == []
