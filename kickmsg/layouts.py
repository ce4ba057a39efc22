"""Which channel layout a new region gets: 4 (native kickmsg 0.1.0) or 9
(native kickmsg 0.9.2).

``DEFAULT_LAYOUT`` is the default of ``SharedRegion.create`` /
``create_or_open`` and ``Node``; ``$KICKMSG_LAYOUT`` (``4`` or ``9``)
overrides it for a process, a ``layout=`` argument for one call. It is 9,
what today's native library speaks.
"""
import os

__all__ = ["DEFAULT_LAYOUT", "LAYOUT_4", "LAYOUT_9", "LAYOUT_ENV", "SUPPORTED_LAYOUTS", "check_layout", "chosen_layout"]

LAYOUT_4 = 4
LAYOUT_9 = 9
SUPPORTED_LAYOUTS = (LAYOUT_4, LAYOUT_9)
DEFAULT_LAYOUT = LAYOUT_9
LAYOUT_ENV = "KICKMSG_LAYOUT"


def check_layout(layout: object, source: str = "layout") -> int:
    """``layout`` if it is a supported layout version, else ValueError naming it."""
    if type(layout) is not int or layout not in SUPPORTED_LAYOUTS:
        raise ValueError(f"{source} must be 4 or 9, got {layout!r}")
    return layout


def chosen_layout(layout: int | None = None) -> int:
    """The layout a new region gets: ``layout`` if given (TypeError if it
    is not an int, ValueError if not 4 or 9), else ``$KICKMSG_LAYOUT`` if
    set, else DEFAULT_LAYOUT."""
    if layout is not None:
        if type(layout) is not int:
            raise TypeError(f"layout must be an int, 4 or 9, got {layout!r}")
        return check_layout(layout)
    text = os.environ.get(LAYOUT_ENV)
    if text is None:
        return DEFAULT_LAYOUT
    if text.strip() not in ("4", "9"):
        raise ValueError(f"{LAYOUT_ENV} must be 4 or 9, got {text!r}")
    return int(text)
