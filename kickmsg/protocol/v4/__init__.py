"""Layout 4: channels byte-compatible with native ``kickmsg==0.1.0``.

Each module reads beside its part of the layout-4 design (seed 000):

- ``layout``: constants, byte layout, sizes, geometry checks, naming the bytes;
- ``region``: ``Region`` (the mapping, its geometry, the addresses the
  flows use); create, create_or_open, attach checks, initialisation (in
  place too);
- ``publish``: ``Publisher``, the publish flow whole (allocate, send,
  publish), and ``wait_and_capture_slot``;
- ``receive``: the subscriber core, ``Subscriber`` (join, receive: steps
  1-3 in ``pin_next``, skip to newest, the blocking receive and a
  WaitSet's words, leave) and its ``SampleView``;
- ``rings``: a ring's lifecycle: ``join``, ``leave`` (the teardown),
  ``set_state``, ``drain`` (drain_unconsumed);
- ``repair``: diagnose, repair_locked_entries, reset_retired_rings,
  reclaim_dead_subscribers, free_ring, reclaim_orphaned_slots, the schema
  claim.

The slot pool's free stack (publish step 1, the releases) is shared with
layout 9: ``kickmsg.protocol.freestack``. ``kickmsg.SharedRegion`` is a
``Region`` with the version-agnostic API above it; it, ``Publisher`` and
``Subscriber`` call these flows. Nothing here imports the API.
"""

__all__: list[str] = []
