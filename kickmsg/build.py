"""Which build runs: a few modules compiled, or every module from source.

Installing kickmsg compiles the modules of setup.py's ``COMPILED`` (the door
to the atomics, ``kickmsg/atomics.py``, and the free stack,
``kickmsg/protocol/freestack.py``) with Cython in pure-Python mode: the
same ``.py`` source, typed by the ``.pxd`` beside it, built into an
extension module that Python imports in its place; the other flows stay
Python in both builds. With ``KICKMSG_PURE=1`` in the environment, ``import
kickmsg`` loads every kickmsg module from its ``.py`` source instead: the
reference, which the explorer checks (``kickmsg verify`` runs itself that
way), and the fallback. ``kickmsg.atomics.COMPILED`` says which build a
process runs; ``compiled_modules`` names what runs compiled.
"""
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["PURE_REQUESTED", "SourceFirst", "compiled_modules", "describe", "pure_environment"]

PURE_REQUESTED = os.environ.get("KICKMSG_PURE") == "1"


class SourceFirst:
    """A finder for ``sys.meta_path`` that loads each kickmsg module with a
    ``.py`` file from that file, ahead of an extension module beside it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("kickmsg.") or not path:
            return None
        module_name = fullname.rpartition(".")[2]
        for directory in path:
            source = os.path.join(directory, module_name + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None  # a package, or the cffi shim: the usual finders


def compiled_modules() -> list[str]:
    """The kickmsg modules this process imported compiled: from an
    extension module with its ``.py`` source beside it (the cffi shim has
    none), sorted."""
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name.startswith("kickmsg.") and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            found += [name] if os.path.isfile(os.path.join(os.path.dirname(path), name.rpartition(".")[2] + ".py")) else []
    return sorted(found)


def describe() -> str:
    """Which build runs, in words (``kickmsg --version``)."""
    compiled = compiled_modules()
    return f"Python, compiled: {', '.join(name.removeprefix('kickmsg.') for name in compiled)}" if compiled else "pure Python"


def pure_environment() -> dict[str, str]:
    """This process's environment with the pure build selected, for a child
    that must run the source (the explorer)."""
    return {**os.environ, "KICKMSG_PURE": "1"}


if PURE_REQUESTED and not any(isinstance(finder, SourceFirst) for finder in sys.meta_path):
    # Just ahead of the finder of files (finders placed before it, e.g. a
    # tool's import hook, still come first).
    before = sys.meta_path.index(importlib.machinery.PathFinder) if importlib.machinery.PathFinder in sys.meta_path else 0
    sys.meta_path.insert(before, SourceFirst())
