"""Data plane, CLI, Triton integration and statistics of the serving platform."""

__version__ = "0.1.0"
