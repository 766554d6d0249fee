"""`serving llm`: the engine processes the control plane keeps for the deployed LLM versions."""
