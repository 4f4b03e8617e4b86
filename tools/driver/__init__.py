"""A deployment driver with the Pulumi engine's semantics (see tools/driver/engine.py)."""

from tools.driver.engine import Driver, Outcome, ProviderError, StackConfig, Step

__all__ = ["Driver", "Outcome", "ProviderError", "StackConfig", "Step"]
