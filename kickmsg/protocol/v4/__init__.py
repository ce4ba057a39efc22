"""Layout 4: channels byte-compatible with native ``kickmsg==0.1.0``.

Each module reads beside its part of the layout-4 design (seed 000):

- ``layout``: constants, byte layout, sizes, geometry checks, naming the bytes;
- ``region``: create, create_or_open, attach checks, initialisation (in place too).

The slot pool's free stack is shared with layout 9 (``kickmsg.protocol.freestack``).
The publish, receive, ring lifecycle and repair flows of layout 4 are still
methods of ``kickmsg.Publisher``, ``Subscriber`` and ``SharedRegion``.
"""
