"""LLM endpoints' engine side: Hugging Face folders as artifacts, what vLLM can serve, and the launcher
that keeps one vLLM OpenAI server per deployed model version (docs/llm-engine.md)."""
