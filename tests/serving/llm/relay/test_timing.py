"""The ``llm`` event field measured on stream chunks (serving/llm/relay/timing.py), no engine."""
from serving.llm.relay.timing import MAX_GAPS, GenerationTimer


def chat(content=None, finish=None, role=None):
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_stream_first_token_is_the_first_content_and_gaps_are_between_content_chunks():
    timer = GenerationTimer(t0=0.0, stream=True)
    for event in (chat(role="assistant", content=""), chat("Hel"), chat("lo"), chat("!"), chat(finish="length"),
                  {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}):
        timer.chunk(event)
    llm = timer.event({"prompt_tokens": 5, "completion_tokens": 3})
    assert llm["ttft_s"] > 0 and len(llm["itl_s"]) == 2 and all(g >= 0 for g in llm["itl_s"])
    assert llm["e2e_s"] >= llm["ttft_s"] + sum(llm["itl_s"])
    assert (llm["prompt_tokens"], llm["completion_tokens"], llm["finish_reason"], llm["stream"]) == (5, 3, "length", True)


def test_completions_text_chunks_and_the_gap_cap():
    timer = GenerationTimer(t0=0.0, stream=True)
    for _ in range(MAX_GAPS + 10):
        timer.chunk({"choices": [{"index": 0, "text": "a", "finish_reason": None}]})
    timer.chunk({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    llm = timer.event(None)
    assert len(llm["itl_s"]) == MAX_GAPS and llm["finish_reason"] == "stop" and llm["completion_tokens"] == 0


def test_non_streaming_has_no_ttft_and_the_answers_finish_reason():
    timer = GenerationTimer(t0=0.0, stream=False)
    timer.answered({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    llm = timer.event({"prompt_tokens": 4, "completion_tokens": 1})
    assert llm["ttft_s"] is None and llm["itl_s"] == [] and llm["e2e_s"] > 0 and llm["finish_reason"] == "stop"
    assert llm["stream"] is False


def test_content_chunks_counted_in_a_read_passed_on_unparsed():
    """A read of 3 tokens, then one of 2: the first token, a gap to the next read, no gap inside a read."""
    timer = GenerationTimer(t0=0.0, stream=True)
    timer.tokens(0)
    timer.tokens(3)
    timer.tokens(2)
    llm = timer.event(None)
    assert llm["ttft_s"] > 0 and len(llm["itl_s"]) == 4 and llm["itl_s"].count(0.0) == 3 and llm["itl_s"][2] > 0
    capped = GenerationTimer(t0=0.0, stream=True)
    capped.tokens(MAX_GAPS + 50)
    assert len(capped.event(None)["itl_s"]) == MAX_GAPS
