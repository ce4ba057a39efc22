"""Operating channels: looking at them from outside, while they run.

- ``diagnostics``: every figure the ``kickmsg`` command shows (info, stats,
  registry, blackboard, diagnose), as data;
- ``audit``: a read-only check of a region's invariants (``kickmsg.audit``);
- ``exporter``: Prometheus metrics of every channel (the ``metrics`` extra).
"""

__all__: list[str] = []
