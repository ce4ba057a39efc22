"""Module paths that moved, kept working for one release.

``install`` adds a finder to the import system that serves each old path
of ``MOVED`` as an empty module whose ``__getattr__`` calls
``moved_attribute``: it warns (``DeprecationWarning``, naming the new path)
and hands out the new module's attribute, the very same object. The next
release removes the finder and this table.
"""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Sequence

__all__ = ["MOVED", "install", "moved_attribute"]

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


class MovedPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads the old paths of ``MOVED``, and only those."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def exec_module(self, module: ModuleType) -> None:
        old = module.__name__
        module.__doc__ = f"Moved to ``{MOVED[old]}``: this path still works, with a DeprecationWarning, for one release."
        module.__dict__["__getattr__"] = lambda name: moved_attribute(old, name)


def install() -> None:
    """Serve the old paths (once ``kickmsg`` is loaded). The import system
    makes a module it loads an attribute of its package: an old path whose
    name the package already gives to something else (``kickmsg.audit``, the
    function) is therefore loaded here, now, straight into ``sys.modules``,
    where an import finds it without loading it again."""
    if any(isinstance(finder, MovedPathFinder) for finder in sys.meta_path):
        return  # kickmsg reloaded
    finder = MovedPathFinder()
    sys.meta_path.append(finder)
    for old in MOVED:
        package, _, name = old.rpartition(".")
        if package in sys.modules and hasattr(sys.modules[package], name):
            spec = importlib.util.spec_from_loader(old, finder)
            assert spec is not None  # a loader was given
            module = importlib.util.module_from_spec(spec)
            finder.exec_module(module)
            sys.modules[old] = module
