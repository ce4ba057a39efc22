"""Layout 4: channels byte-compatible with native ``kickmsg==0.1.0``.

Each module reads beside its part of the layout-4 design (seed 000):

- ``layout``: constants, byte layout, sizes, geometry checks, naming the bytes.

The slot pool's free stack is shared with layout 9 (``kickmsg.protocol.freestack``).
``kickmsg.SharedRegion``, ``Publisher`` and ``Subscriber`` run the layout-4 flows.
"""
