"""Recording channels and playing recordings back (the ``spark`` or ``mcap`` extras).

- ``record``: the recorder (``Recorder``), ``recover`` for the files of a
  killed one, and ``play``;
- ``files``: what the writers and readers of a recording share: its columns,
  metadata key and the two formats (Parquet, MCAP);
- ``mcap``: recordings as MCAP files (Foxglove);
- ``stamp``: the publish time a payload may start with.

The package imports none of them: each needs only its own extra.
"""

__all__: list[str] = []
