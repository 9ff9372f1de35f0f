"""Adapters that run agents written with other frameworks (optional extras)."""
