"""LoRA adapters: PEFT folders checked as model versions of their base (peft.py), and loaded into and
out of running engines (loading.py)."""
