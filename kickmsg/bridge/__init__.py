"""Bridging channels across hosts over Eclipse Zenoh (the ``bridge`` extra).

A bridge forwards chosen local channels out to Zenoh (exports) and chosen
Zenoh keys into local channels (imports): ``kickmsg.bridge.options`` holds
what it is told (``BridgeOptions``, a TOML file), ``kickmsg.bridge.forwarding``
how it forwards (``Bridge``, ``run``). The ``kickmsg bridge`` command is
``kickmsg.cli.bridging``.
"""
from kickmsg.bridge.forwarding import Bridge, ChannelFigures, run
from kickmsg.bridge.options import BridgeOptions, ImportSpec, load_file
from kickmsg.errors import BridgeError

__all__ = ["Bridge", "BridgeError", "BridgeOptions", "ChannelFigures", "ImportSpec", "load_file", "run"]
