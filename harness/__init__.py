"""xfalign: cross-framework numerical alignment harness (Paddle vs Megatron-Core)."""

__version__ = "0.1.0"
