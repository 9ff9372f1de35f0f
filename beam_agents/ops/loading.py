"""Objects named on a command line as MODULE:NAME (an agent, a tool table, a keyring loader)."""

from __future__ import annotations

import importlib

__all__ = ["load_object"]


def load_object(spec: str) -> object:
    """The attribute NAME of module MODULE, for "MODULE:NAME". Raises ValueError naming what
    is wrong."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{spec!r} is not MODULE:NAME")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name}: {e}") from None
    except Exception as e:  # a module that fails as it loads: its error, not a traceback
        raise ValueError(f"cannot import {module_name}: {type(e).__name__}: {e}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"{module_name} has no {attribute}") from None
