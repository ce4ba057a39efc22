"""Builds the cffi atomics shim; everything else is declared in pyproject.toml."""
from setuptools import setup

setup(cffi_modules=["kickmsg/_build.py:ffibuilder"])
