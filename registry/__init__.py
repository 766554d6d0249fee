"""Model registry and control plane."""
