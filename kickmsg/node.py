"""Node: the naming conventions and channel patterns on top of regions.

=========  ================================  ==============================
pattern    shared-memory name                 made by
=========  ================================  ==============================
PubSub     ``/{prefix}_{topic}``              advertise / subscribe
Broadcast  ``/{prefix}_broadcast_{channel}``  join_broadcast (pub + sub)
Mailbox    ``/{prefix}_{owner}_mbx_{tag}``    create_mailbox (owner reads),
                                              open_mailbox (others write)
=========  ================================  ==============================

Names are not sanitised (as in 0.1.0): a topic that breaks the naming rule
(``kickmsg.shm.NAME_RULE``: a ``/``, a control character, ...) is refused
as an invalid shared-memory name. A node keeps every region it mapped and
reuses it for later calls on the same name (unless it was re-created since),
except ``advertise`` and ``create_mailbox``, which always create (replacing
any region of that name: publishers and subscribers of this package attached
to the old one follow the name to the new one).
"""
import copy

from kickmsg.config import ChannelType, Config
from kickmsg.publisher import Publisher
from kickmsg.region import SharedRegion, unlink_shm
from kickmsg.schema import SchemaInfo
from kickmsg.subscriber import Subscriber


class BroadcastHandle:
    """A node's two ends of a broadcast channel: ``pub`` and ``sub``."""

    def __init__(self, pub: Publisher, sub: Subscriber) -> None:
        self.pub = pub
        self.sub = sub

    def __repr__(self) -> str:
        return f"BroadcastHandle(pub={self.pub!r}, sub={self.sub!r})"


class Node:
    """A named participant: creates and opens channels by topic name."""

    def __init__(self, name: str, prefix: str = "kickmsg") -> None:
        if not isinstance(name, str) or not isinstance(prefix, str):
            raise TypeError(f"Node name and prefix must be str, got {name!r} and {prefix!r}")
        self._name = name
        self._prefix = prefix
        self._regions: dict[str, SharedRegion] = {}  # shm name -> region this node mapped

    @property
    def name(self) -> str:
        return self._name

    @property
    def prefix(self) -> str:
        return self._prefix

    # -- names ------------------------------------------------------------

    def _topic_name(self, topic: str) -> str:
        return f"/{self._prefix}_{topic}"

    def _broadcast_name(self, channel: str) -> str:
        return f"/{self._prefix}_broadcast_{channel}"

    def _mailbox_name(self, owner: str, tag: str) -> str:
        return f"/{self._prefix}_{owner}_mbx_{tag}"

    # -- the three ways to get a region -------------------------------------

    def _create(self, shm_name: str, channel_type: ChannelType, cfg: Config) -> SharedRegion:
        region = SharedRegion.create(shm_name, channel_type, cfg, self._name)
        self._regions[shm_name] = region
        return region

    def _mapped(self, shm_name: str) -> SharedRegion | None:
        """The region this node mapped for the name, unless it was re-created
        since (in place, or as another object)."""
        region = self._regions.get(shm_name)
        return region if region is not None and not region.replaced() else None

    def _open(self, shm_name: str) -> SharedRegion:
        region = self._mapped(shm_name) or SharedRegion.open(shm_name)
        self._regions[shm_name] = region
        return region

    def _create_or_open(self, shm_name: str, channel_type: ChannelType, cfg: Config) -> SharedRegion:
        region = self._mapped(shm_name) or SharedRegion.create_or_open(shm_name, channel_type, cfg, self._name)
        self._regions[shm_name] = region
        return region

    # -- PubSub ---------------------------------------------------------------

    def advertise(self, topic: str, cfg: Config | None = None) -> Publisher:
        """Create the topic's region (replacing any) and publish into it."""
        return Publisher(self._create(self._topic_name(topic), ChannelType.PubSub, cfg or Config()), name=self._name)

    def subscribe(self, topic: str) -> Subscriber:
        """Open an existing topic and subscribe to it."""
        return Subscriber(self._open(self._topic_name(topic)))

    def advertise_or_join(self, topic: str, cfg: Config) -> Publisher:
        """Publish into the topic, creating it unless it exists with this config."""
        return Publisher(self._create_or_open(self._topic_name(topic), ChannelType.PubSub, cfg), name=self._name)

    def subscribe_or_create(self, topic: str, cfg: Config) -> Subscriber:
        """Subscribe to the topic, creating it unless it exists with this config."""
        return Subscriber(self._create_or_open(self._topic_name(topic), ChannelType.PubSub, cfg))

    def unlink_topic(self, topic: str) -> None:
        unlink_shm(self._topic_name(topic))

    # -- Broadcast --------------------------------------------------------------

    def join_broadcast(self, channel: str, cfg: Config | None = None) -> BroadcastHandle:
        """Join an N-to-N channel as both publisher and subscriber."""
        region = self._create_or_open(self._broadcast_name(channel), ChannelType.Broadcast, cfg or Config())
        return BroadcastHandle(Publisher(region, name=self._name), Subscriber(region))

    def unlink_broadcast(self, channel: str) -> None:
        unlink_shm(self._broadcast_name(channel))

    # -- Mailbox ----------------------------------------------------------------

    def create_mailbox(self, tag: str, cfg: Config | None = None) -> Subscriber:
        """Create this node's mailbox ``tag`` (one subscriber: us) and read it."""
        mailbox_cfg = copy.copy(cfg or Config())
        mailbox_cfg.max_subscribers = 1
        return Subscriber(self._create(self._mailbox_name(self._name, tag), ChannelType.PubSub, mailbox_cfg))

    def open_mailbox(self, owner_node: str, tag: str) -> Publisher:
        """Write into another node's mailbox."""
        return Publisher(self._open(self._mailbox_name(owner_node, tag)), name=self._name)

    def unlink_mailbox(self, tag: str, owner_node: str | None = None) -> None:
        unlink_shm(self._mailbox_name(owner_node or self._name, tag))

    # -- schema -----------------------------------------------------------------

    def topic_schema(self, topic: str) -> SchemaInfo | None:
        """The topic's schema descriptor; None if unset or if this node never
        mapped the topic."""
        region = self._regions.get(self._topic_name(topic))
        return region.schema() if region is not None else None

    def try_claim_topic_schema(self, topic: str, info: SchemaInfo) -> bool:
        """Claim the schema of a topic this node mapped; False otherwise."""
        region = self._regions.get(self._topic_name(topic))
        return region.try_claim_schema(info) if region is not None else False

    def __repr__(self) -> str:
        return f"Node(name={self._name!r}, prefix={self._prefix!r}, regions={sorted(self._regions)})"
