"""The Kickmsg protocol cores, one subpackage per channel layout.

``kickmsg.protocol.v4`` speaks layout 4 (native ``kickmsg==0.1.0``),
``kickmsg.protocol.v9`` layout 9 (native ``kickmsg==0.9.2``). Beside them is
what both share: ``common`` (constants, the schema descriptor's bytes, the
config hash) and ``freestack`` (the slot pool's Treiber stack). The atomics
door, futex, shared-memory objects, hashes and schema descriptors stay at
the top level (``kickmsg.atomics``, ``kickmsg.shm``, ``kickmsg.hash``,
``kickmsg.schema``): the API uses them too.
"""

__all__: list[str] = []
