"""What a request tells the routing policies (serving/llm/relay/hints.py): its session key, and the key
of its prompt's leading token blocks, tokenized with the model's own tokenizer (trained here)."""
from __future__ import annotations

import pytest

from serving.testmodels_llm import train_tokenizer
from serving.llm.relay.hints import route_hint
from serving.llm.routing.policies.prefix import BLOCK_TOKENS, PREFIX_BLOCKS, prefix_key
from serving.llm.relay.tokens import PromptCounter
from serving.worker.runtime import Target


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    train_tokenizer(folder)
    counter = PromptCounter(lambda sha: folder, folder / "unpacked")
    counter.prepare(TARGET)
    return counter


TARGET = Target(model="m", version=1, weight=100, triton_name="", artifact="tok", inputs=(), outputs=())
SYSTEM = "the quick brown fox jumps over the lazy dog " * 30  # far more than 128 tokens


def chat(system: str, *turns: str) -> dict:
    return {"model": "chat", "messages": [{"role": "system", "content": system},
                                          *({"role": "user", "content": t} for t in turns)]}


def test_the_session_is_the_header_else_the_user_field(tokens):
    assert route_hint(tokens, TARGET, "completions", {"prompt": "x", "user": "ann"}).session == "ann"
    assert route_hint(tokens, TARGET, "completions", {"prompt": "x", "user": "ann"}, "s-1").session == "s-1"
    assert route_hint(tokens, TARGET, "completions", {"prompt": "x", "user": 7}).session is None


def test_a_conversations_turns_share_their_prefix_key_and_other_conversations_do_not(tokens):
    key = lambda request: route_hint(tokens, TARGET, "chat/completions", request).prefix()  # noqa: E731
    first = key(chat(SYSTEM, "hello"))
    assert first is not None
    assert key(chat(SYSTEM, "hello", "how are you today?")) == first, "a later turn, the same leading blocks"
    assert key(chat("numbers like 1 2 3 " + SYSTEM, "hello")) != first


def test_the_key_is_that_of_the_first_blocks_as_the_engine_tokenizes_the_prompt(tokens):
    tokenizer = tokens.tokenizer(TARGET)
    ids = tokenizer(SYSTEM)["input_ids"]  # a completion prompt: with the special tokens the tokenizer adds
    assert len(ids) > BLOCK_TOKENS * PREFIX_BLOCKS
    hint = route_hint(tokens, TARGET, "completions", {"prompt": SYSTEM})
    assert hint.prefix() == prefix_key(ids)
    assert route_hint(tokens, TARGET, "completions", {"prompt": [ids, [1, 2]]}).prefix() == prefix_key(ids)
    assert route_hint(tokens, TARGET, "completions", {"prompt": "hello"}).prefix() is None, "under one block"
    rendered = tokenizer.apply_chat_template(chat(SYSTEM, "hi")["messages"], tokenize=False, add_generation_prompt=True)
    chat_ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert route_hint(tokens, TARGET, "chat/completions", chat(SYSTEM, "hi")).prefix() == prefix_key(chat_ids)
