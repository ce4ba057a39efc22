"""Which build runs: a few modules compiled, or every module from source.

Installing kickmsg compiles the modules of setup.py's ``COMPILED`` (the door
to the atomics, ``kickmsg/atomics.py``; the free stack,
``kickmsg/protocol/freestack.py``; each layout's region, publish and
receive flows in ``kickmsg/protocol/v4/`` and ``v9/``, and layout 9's
layout and words) with Cython in pure-Python mode: the same ``.py`` source, typed by
the ``.pxd`` beside it, built into an extension module that Python imports
in its place; the other flows (repairs, registry, blackboard) stay Python
in both builds. With ``KICKMSG_PURE=1`` in the environment, ``import
kickmsg`` loads every kickmsg module from its ``.py`` source instead: the
reference, which the explorer checks (``kickmsg verify`` runs itself that
way), and the fallback. ``kickmsg.atomics.COMPILED`` says which build a
process runs; ``compiled_modules`` names what runs compiled, and
``warn_if_stale`` warns when one's source was edited since it was compiled
(setup.py records what it compiled from).
"""
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType

__all__ = [
    "PURE_REQUESTED", "SOURCE_DIGESTS", "SourceFirst", "compiled_modules", "describe", "pure_environment",
    "source_digests", "stale_modules", "warn_if_stale",
]

PURE_REQUESTED = os.environ.get("KICKMSG_PURE") == "1"
# Written by setup.py beside this file: each compiled module's source digest when it was compiled.
SOURCE_DIGESTS = os.path.join(os.path.dirname(__file__), "_compiled_sources.json")


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


def _compiled_sources() -> dict[str, str]:
    """Each kickmsg module this process imported compiled (from an extension
    module with its ``.py`` source beside it; the cffi shim has none), and
    that source's path."""
    found = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        source = os.path.join(os.path.dirname(path), name.rpartition(".")[2] + ".py")
        if name.startswith("kickmsg.") and path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) and os.path.isfile(source):
            found[name] = source
    return found


def compiled_modules() -> list[str]:
    """The kickmsg modules this process imported compiled, sorted."""
    return sorted(_compiled_sources())


def source_digests(source: str) -> dict[str, str]:
    """The sha256 of a module's ``.py`` and of the ``.pxd`` beside it, by
    suffix, of those there are (as setup.py records them)."""
    digests = {}
    for suffix in (".py", ".pxd"):
        path = source[:-3] + suffix
        if os.path.isfile(path):
            with open(path, "rb") as file:
                digests[suffix] = hashlib.sha256(file.read()).hexdigest()
    return digests


def stale_modules(recorded: Mapping[str, Mapping[str, str]] | None = None) -> list[str]:
    """The compiled modules this process runs whose ``.py`` or ``.pxd``
    differs from what they were compiled from (``recorded``: by default
    setup.py's record; without one, nothing can be told and none is; a file
    not installed is not compared)."""
    if recorded is None:
        try:
            with open(SOURCE_DIGESTS) as file:
                recorded = json.load(file)
        except (OSError, ValueError):
            return []
    stale = []
    for name, source in _compiled_sources().items():
        compiled_from = recorded.get(name)
        if compiled_from is not None and any(compiled_from.get(suffix) != digest
                                             for suffix, digest in source_digests(source).items()):
            stale.append(name)
    return sorted(stale)


def warn_if_stale() -> None:
    """A RuntimeWarning when a compiled module runs older code than its
    source: an edit not yet rebuilt would otherwise be silently ignored."""
    stale = stale_modules()
    if stale:
        warnings.warn(
            f"compiled from an older source than the .py/.pxd beside it, so an edit there does not run: "
            f"{', '.join(stale)}; rebuild (pip install -e ., or .venv/bin/python setup.py build_ext --inplace), "
            f"or set KICKMSG_PURE=1 to run every module from its source",
            RuntimeWarning, stacklevel=3,
        )


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
