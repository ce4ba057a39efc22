"""The Kickmsg protocol cores, one subpackage per channel layout.

``kickmsg.protocol.v9`` speaks layout 9 (native ``kickmsg==0.9.2``). The
layout-4 core still lives in the top-level modules (``kickmsg.layout``,
``kickmsg.publisher``, ...) until it moves beside it.
"""
