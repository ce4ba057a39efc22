"""Builds the cffi shim (two modules, see kickmsg/_build.py) and the compiled
build: the modules in COMPILED, compiled from their own source by Cython in
pure-Python mode (KICKMSG_PURE=1 at run time runs the source instead,
kickmsg/build.py). Everything else is declared in pyproject.toml."""
import json
import os
import runpy

from Cython.Build import cythonize
from setuptools import Extension, setup

# Each compiled from its unchanged source, typed by the .pxd beside it: the
# door to the atomics (each call of a flow reaches the shim's C function with
# no cffi layer), the free stack, each layout's region, publish and receive
# flows (their door, region, rings, cursor and words typed), layout 9's
# geometry snapshot (in its layout.py) and its sequence and meta words. The
# other flows (repairs, registry, blackboard) stay Python: compiled untyped,
# a flow ran slower than CPython runs it (docs/explanation/performance.md,
# "The compiled build").
COMPILED = [
    "kickmsg/atomics.py",
    "kickmsg/protocol/freestack.py",
    "kickmsg/protocol/v4/region.py",
    "kickmsg/protocol/v4/publish.py",
    "kickmsg/protocol/v4/receive.py",
    "kickmsg/protocol/v9/layout.py",
    "kickmsg/protocol/v9/region.py",
    "kickmsg/protocol/v9/publish.py",
    "kickmsg/protocol/v9/receive.py",
    "kickmsg/protocol/v9/words.py",
]


# What each compiled module was compiled from (the digests of its .py and its
# .pxd), for kickmsg.build to notice a source edited since: written beside
# the modules, installed with them (the .pxd files too).
SOURCE_DIGESTS = "kickmsg/_compiled_sources.json"


def record_source_digests() -> None:
    # kickmsg/build.py run on its own: the package cannot be imported before it is built.
    source_digests = runpy.run_path("kickmsg/build.py")["source_digests"]
    digests = {path[:-3].replace("/", "."): source_digests(path) for path in COMPILED}
    with open(SOURCE_DIGESTS, "w") as file:
        json.dump(digests, file, indent=1, sort_keys=True)


def compiled_extensions() -> list[Extension]:
    record_source_digests()
    extensions = [Extension(path[:-3].replace("/", "."), [path], include_dirs=["kickmsg"]) for path in COMPILED]
    return cythonize(
        extensions,
        # Types come from the .pxd files only, never from the sources' annotations.
        compiler_directives={"language_level": 3, "binding": False, "embedsignature": True, "annotation_typing": False},
        build_dir="build/cython",  # the generated C, out of the source tree
        nthreads=os.cpu_count() or 1,
        quiet=True,
    )


setup(
    cffi_modules=["kickmsg/_build.py:atomics_builder", "kickmsg/_build.py:futex_builder"],
    ext_modules=compiled_extensions(),
)
