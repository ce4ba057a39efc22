"""Builds the cffi shim (two modules, see kickmsg/_build.py); everything else
is declared in pyproject.toml."""
from setuptools import setup

setup(cffi_modules=["kickmsg/_build.py:atomics_builder", "kickmsg/_build.py:futex_builder"])
