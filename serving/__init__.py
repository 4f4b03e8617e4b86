"""Serving-side helpers that run next to Triton (stand-in model, load gate)."""
