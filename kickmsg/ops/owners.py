"""Moved to ``kickmsg.owners``: this path still works, with a DeprecationWarning, for one release."""
from typing import Any

from kickmsg._moved import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)
