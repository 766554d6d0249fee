"""Data plane, CLI, Triton integration and statistics of the serving platform."""
