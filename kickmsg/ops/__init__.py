"""Operating channels: looking at them from outside, while they run.

- ``diagnostics``: every figure the ``kickmsg`` command shows (info, stats,
  registry, blackboard, diagnose), as data;
- ``audit``: a read-only check of a region's invariants (``kickmsg.audit``);
- ``owners``: the record files kept beside a region, naming who owns each
  ring and which publishers and bridges use it (written by the API, read here);
- ``exporter``: Prometheus metrics of every channel (the ``metrics`` extra).
"""

__all__: list[str] = []
