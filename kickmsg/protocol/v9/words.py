"""The sequence and meta words of a layout-9 ring entry (WIRE9.md A.4): what
a sequence value says (a commit, a skip marker, a publisher's or a
repairer's lock, and for which position) and how a claim (meta) packs a
position's tag with a slot. The flows read and build their words only
through these.
"""
from kickmsg.protocol.v9.layout import (
    META_SLOT_BITS,
    META_SLOT_MASK,
    META_TAG_MASK,
    META_TAG_SIGN,
    SEQ_LOCK_BIT,
    SEQ_REPAIR_BIT,
    SEQ_VALUE_MASK,
)

__all__ = [
    "meta_precedes", "meta_slot_field", "meta_tag", "meta_tag_of", "pack_meta", "publisher_lock", "repairer_lock",
    "seq_locked", "seq_pos", "seq_skip", "skip_marker",
]


def seq_locked(seq: int) -> bool:
    """A publisher's or a repairer's lock (bit 63)."""
    return bool(seq & SEQ_LOCK_BIT)


def seq_skip(seq: int) -> bool:
    """A skip marker: consumed, no sample (bits 63,62 = 0,1)."""
    return seq & (SEQ_LOCK_BIT | SEQ_REPAIR_BIT) == SEQ_REPAIR_BIT


def seq_pos(seq: int) -> int:
    """The value part: pos + 1 for commits and skips, pos for locks."""
    return seq & SEQ_VALUE_MASK


def publisher_lock(pos: int) -> int:
    return SEQ_LOCK_BIT | (pos & SEQ_VALUE_MASK)


def repairer_lock(pos: int) -> int:
    return SEQ_LOCK_BIT | SEQ_REPAIR_BIT | (pos & SEQ_VALUE_MASK)


def skip_marker(pos: int) -> int:
    return SEQ_REPAIR_BIT | ((pos + 1) & SEQ_VALUE_MASK)


def meta_tag_of(pos: int) -> int:
    """The tag a claim installed by the publisher of ``pos`` carries."""
    return (pos + 1) & META_TAG_MASK


def pack_meta(pos: int, slot: int) -> int:
    return meta_tag_of(pos) << META_SLOT_BITS | ((slot + 1) & META_SLOT_MASK)


def meta_tag(meta: int) -> int:
    return (meta >> META_SLOT_BITS) & META_TAG_MASK


def meta_slot_field(meta: int) -> int:
    """slot index + 1; 0 means no claim."""
    return meta & META_SLOT_MASK


def meta_precedes(meta: int, pos: int) -> bool:
    """Whether the claim ``meta`` was installed for a position before ``pos``
    (serial-number order over 40 bits)."""
    distance = (meta_tag(meta) - meta_tag_of(pos)) & META_TAG_MASK
    return distance != 0 and bool(distance & META_TAG_SIGN)
