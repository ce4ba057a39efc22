"""Module paths that moved, kept working for one release.

Each old path is a thin module whose ``__getattr__`` calls ``moved_attribute``:
it warns (``DeprecationWarning``, naming the new path) and hands out the
new module's attribute, the very same object. The next release removes the
old modules and this table.
"""
import importlib
import warnings
from typing import Any

__all__ = ["MOVED", "moved_attribute"]

MOVED = {
    "kickmsg.audit": "kickmsg.ops.audit",
    "kickmsg.crossdriver": "kickmsg.verify.crossdriver",
    "kickmsg.crosscheck": "kickmsg.verify.crosscheck",
    "kickmsg.diagnostics": "kickmsg.ops.diagnostics",
    "kickmsg.exporter": "kickmsg.ops.exporter",
    "kickmsg.faults": "kickmsg.verify.faults",
    "kickmsg.mcap_file": "kickmsg.recording.mcap",
    "kickmsg.ops.owners": "kickmsg.owners",
    "kickmsg.record": "kickmsg.recording.record",
    "kickmsg.region9": "kickmsg.region",
    "kickmsg.stamp": "kickmsg.recording.stamp",
}


def moved_attribute(old: str, name: str) -> Any:
    """Attribute ``name`` of the module that ``old`` moved to, with a warning."""
    if name.startswith("__"):  # the import system's own look-ups (__path__, __all__...): not the user's
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    new = MOVED[old]
    module = importlib.import_module(new)
    if not hasattr(module, name):  # not there before either, or private helpers that did not move
        raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {new})")
    warnings.warn(f"{old} moved to {new}: import {name} from {new} ({old} goes away in the next release)",
                  DeprecationWarning, stacklevel=3)
    return getattr(module, name)
