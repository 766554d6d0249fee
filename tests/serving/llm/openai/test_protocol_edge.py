"""The OpenAI front end's edge without an engine: request shapes, error shapes, model names, and the
prompt counts the context check uses, on the tiny Llama's folder as the registry stores it (a tar)."""
from __future__ import annotations

import json

import pytest

from serving.testmodels_llm import build_tiny_llama
from serving.worker.errors import NotFound, PayloadTooLarge, Unavailable
from serving.llm.openai.frontend import openai_error
from serving.llm.openai.routes import checked
from serving.llm.openai.protocol import InvalidRequest
from serving.llm.relay.generation import split_model
from serving.llm.relay.tokens import PromptCounter
from serving.worker.runtime import Target


@pytest.mark.parametrize("route, doc, param", [
    ("chat/completions", {"model": "m"}, "messages"),
    ("chat/completions", {"model": "m", "messages": []}, "messages"),
    ("chat/completions", {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ("chat/completions", {"model": "", "messages": [{"role": "user", "content": "x"}]}, "model"),
    ("completions", {"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("completions", {"model": "m", "prompt": {"a": 1}}, "prompt"),
    ("completions", {"model": "m", "prompt": "x", "stream": "sometimes"}, "stream"),
    ("completions", {"prompt": "x"}, "model"),
])
def test_malformed_requests_name_the_field(route, doc, param):
    with pytest.raises(InvalidRequest) as info:
        checked(route, doc)
    assert info.value.param == param and info.value.status == 400
    assert info.value.message.startswith(param)


def test_well_formed_requests_pass_as_sent():
    doc = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
           "return_token_ids": True, "temperature": 0.3}
    assert checked("chat/completions", doc) is doc
    assert checked("completions", {"model": "m", "prompt": [[1, 2], [3]]})["prompt"] == [[1, 2], [3]]
    with pytest.raises(InvalidRequest):
        checked("completions", ["not", "an", "object"])


def test_model_names_an_endpoint_or_a_version():
    assert split_model("chat") == ("chat", None)
    assert split_model("chat/3") == ("chat", 3)
    for bad in ("chat/x", "chat/0", "chat/³"):
        with pytest.raises(NotFound):
            split_model(bad)


def error_body(exc) -> tuple[int, dict, dict]:
    response = openai_error(exc)
    return response.status_code, json.loads(response.body), dict(response.headers)


def test_errors_are_openai_shaped():
    status, body, _ = error_body(InvalidRequest("too long", param="prompt", code="context_length_exceeded"))
    assert (status, body) == (400, {"error": {"message": "too long", "type": "invalid_request_error",
                                              "param": "prompt", "code": "context_length_exceeded"}})
    status, body, _ = error_body(PayloadTooLarge("over the limit"))
    assert status == 400 and body["error"]["code"] == "request_too_large"
    status, body, headers = error_body(Unavailable("engine down", retry_after_s=2))
    assert status == 503 and body["error"]["code"] == "engine_unavailable" and headers["retry-after"] == "2"


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    """The tiny Llama's folder as the registry stores it: the tar of serving/llm/folder.py."""
    from serving.llm.folder import archive_folder

    root = tmp_path_factory.mktemp("llm-tokens")
    bundle = build_tiny_llama(root / "tiny")
    tar = root / "artifact"
    tar.write_bytes(b"".join(archive_folder(bundle.path).chunks()))
    return PromptCounter(lambda sha: tar, root / "unpacked"), bundle


def test_prompt_counts_are_the_tokenizers_own(counter):
    count, bundle = counter
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(bundle.path))
    target = Target(model="tiny", version=1, weight=100, triton_name="", artifact="sha", inputs=(), outputs=())
    count.prepare(target)
    assert not any(p.suffix == ".safetensors" for p in (count.unpack_root).rglob("*"))  # tokenizer files only
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert count.chat(target, {"messages": messages}) == len(out["input_ids"] if hasattr(out, "keys") else out)
    assert count.prompts(target, "the quick brown fox") == [len(tokenizer("the quick brown fox")["input_ids"])]
    assert count.prompts(target, [[1, 2, 3], "a"]) == [3, len(tokenizer("a")["input_ids"])]
    assert count.prompts(target, [5, 6]) == [2]


def test_each_route_is_declared_once_and_the_rest_reads_the_declaration() -> None:
    """The relay's route list, the shadows' and send_request's, and the front end's, all come from
    serving/llm/openai/routes.py."""
    from serving.llm.openai import frontend as front
    from serving.llm.openai import routes as openai_routes
    from serving.llm.relay import shadow_compare as shadow
    from serving.worker import pipeline

    declared = openai_routes.ROUTES
    assert tuple(declared) == ("chat/completions", "completions", "embeddings") and front.ROUTES is declared
    assert shadow.COMPARED_ROUTES == ("chat/completions", "completions")
    assert pipeline.OPENAI_ROUTES == ("chat/completions", "completions")
    assert [r.chat for r in declared.values()] == [True, False, False]
    assert declared["embeddings"].prompt is None, "no context check and no usage to count: nothing generated"
