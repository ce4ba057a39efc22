"""Text for a terminal: payloads and names shown, never obeyed.

A payload, or a name a region was given by another program (the native
library accepts any), may hold control characters: printed as they are,
ESC sequences would recolour, move the cursor or retitle the user's
terminal, a NUL or a carriage return would hide text, and a newline would
split one message or one row over two lines. Every text the ``kickmsg``
command prints passes its untrusted parts through ``printable``.
"""

__all__ = ["printable"]

# C0 controls, DEL and C1 controls (Unicode category Cc) -> a visible escape
_ESCAPES = {code: f"\\x{code:02x}" for code in [*range(0x20), *range(0x7F, 0xA0)]}
_ESCAPES |= {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}


def printable(text: str) -> str:
    """``text`` with every control character escaped as Python writes it
    (``\\n``, ``\\t``, ``\\x1b``, ``\\x9b``): one line, inert on a terminal."""
    return text.translate(_ESCAPES)
