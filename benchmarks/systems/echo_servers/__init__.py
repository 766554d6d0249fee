"""The echo (W0) servers of other systems: each runs under its own virtual environment's Python."""
