"""vLLM's client implements the written LLM engine interface (serving/llm/engines/api.py): every
member the Protocol names, with its parameters in the same order and the same async-ness. A member added
to the interface and not to the engine, or renamed on one side, fails here."""
from __future__ import annotations

import inspect

from serving.llm.engines.vllm import EngineStream, VllmEngine
from serving.llm.engines.api import GenerationStream, LLMEngine


def members(protocol: type) -> dict[str, object]:
    return {name: value for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("_")}


def check(implementation: type, protocol: type) -> None:
    for name, wanted in members(protocol).items():
        got = getattr(implementation, name, None)
        assert got is not None, f"{implementation.__name__} lacks {name}"
        assert list(inspect.signature(got).parameters) == list(inspect.signature(wanted).parameters), name
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(wanted), name
        assert inspect.isasyncgenfunction(got) or not inspect.isasyncgenfunction(wanted), name


def test_vllm_implements_the_llm_engine_interface() -> None:
    check(VllmEngine, LLMEngine)
    assert set(LLMEngine.__annotations__) == {"kind", "tokens"} and VllmEngine.kind == "llm"


def test_its_stream_implements_the_generation_stream() -> None:
    check(EngineStream, GenerationStream)


def test_the_check_sees_a_missing_or_changed_member() -> None:
    class Short:
        kind = "llm"

        async def post(self, target, route, body):  # no hint
            return {}

    for broken in (Short,):
        try:
            check(broken, LLMEngine)
        except AssertionError:
            continue
        raise AssertionError("a missing or changed member passed")
