"""Node: the naming conventions and channel patterns on top of regions.

=========  ================================  ==============================
pattern    shared-memory name                 made by
=========  ================================  ==============================
PubSub     ``/{prefix}_{topic}``              advertise / subscribe
Broadcast  ``/{prefix}_broadcast_{channel}``  join_broadcast (pub + sub)
Mailbox    ``/{prefix}_{owner}_mbx_{tag}``    create_mailbox (owner reads),
                                              open_mailbox (others write)
=========  ================================  ==============================

On layout 9 (``Node(..., layout=9)``, or ``$KICKMSG_LAYOUT``) the names
and checks are 0.9.2's: the second argument is the ``namespace``; node
name, namespace, topic, channel, owner and tag are sanitized
(``kickmsg.protocol.v9.layout.sanitize_component``), a name longer than
255 bytes is a RuntimeError, and every region a node creates is stamped
with its identity hash (``Config.identity``), which opening checks.
A layout-9 node also records its channels in the namespace's participant
registry (``/{namespace}_registry``, WIRE9.md C.4, through ``NodeRows``):
one row per shm name, the Both upgrade, all rows given back when the node
and every handle it returned are gone; ``blackboard(name)`` opens or
creates a Blackboard and registers it too. A layout-4 node (0.1.0 has no
registry) registers nothing and has no ``blackboard``.

On layout 4, names are not sanitised (as in 0.1.0): a topic that breaks the naming rule
(``kickmsg.shm.NAME_RULE``: a ``/``, a control character, ...) is refused
as an invalid shared-memory name. A node keeps every region it mapped and
reuses it for later calls on the same name (unless it was re-created since),
except ``advertise`` and ``create_mailbox``, which always create (replacing
any region of that name: publishers and subscribers of this package attached
to the old one follow the name to the new one).
"""
import copy
import os
import weakref
from collections.abc import Callable
from typing import TypeVar

from kickmsg import layouts
from kickmsg.errors import LayoutError
from kickmsg.config import ChannelType, Config
from kickmsg.protocol.v9 import layout as layout9
from kickmsg.protocol.v9.blackboard import Blackboard, BlackboardConfig
from kickmsg.protocol.v9.registry import Kind, NodeRows, Role
from kickmsg.publisher import Publisher
from kickmsg.region import SharedRegion, unlink_shm
from kickmsg.schema import SchemaInfo
from kickmsg.subscriber import Subscriber

__all__ = ["BroadcastHandle", "Handle", "Node"]


Handle = TypeVar("Handle")

# handle -> the Node that returned it: a handle keeps its node, and so the
# node's registry rows, alive (as 0.9.2's handles keep their Node).
_NODE_OF_HANDLE: "weakref.WeakKeyDictionary[object, Node]" = weakref.WeakKeyDictionary()


class BroadcastHandle:
    """A node's two ends of a broadcast channel: ``pub`` and ``sub``."""

    def __init__(self, pub: Publisher, sub: Subscriber) -> None:
        self.pub = pub
        self.sub = sub

    def __repr__(self) -> str:
        return f"BroadcastHandle(pub={self.pub!r}, sub={self.sub!r})"


class Node:
    """A named participant: creates and opens channels by topic name."""

    def __init__(self, name: str, prefix: str = "kickmsg", *, namespace: str | None = None, layout: int | None = None) -> None:
        """``prefix`` (0.1.0's word) and ``namespace`` (0.9.2's) are the
        same thing, default "kickmsg"; ``layout`` (4 or 9, default
        ``$KICKMSG_LAYOUT``, else ``kickmsg.layouts.DEFAULT_LAYOUT``) is
        the layout of the regions the node creates, and its naming."""
        if namespace is not None:
            if prefix != "kickmsg":
                raise TypeError(f"give the namespace once: prefix={prefix!r} and namespace={namespace!r}")
            prefix = namespace
        if not isinstance(name, str) or not isinstance(prefix, str):
            raise TypeError(f"Node name and prefix must be str, got {name!r} and {prefix!r}")
        self._layout = layouts.chosen_layout(layout)
        if self._layout == layouts.LAYOUT_9:
            name = layout9.sanitize_component(name, "node")
            prefix = layout9.sanitize_component(prefix, "namespace")
        self._name = name
        self._prefix = prefix
        self._regions: dict[str, SharedRegion] = {}  # shm name -> region this node mapped
        self._rows: NodeRows | None = None  # layout 9: this node's registry rows
        if self._layout == layouts.LAYOUT_9:
            self._rows = NodeRows(prefix, name)
            weakref.finalize(self, _deregister_rows, self._rows, os.getpid())

    @property
    def name(self) -> str:
        return self._name

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def namespace(self) -> str:
        """0.9.2's name for ``prefix``."""
        return self._prefix

    @property
    def layout(self) -> int:
        return self._layout

    # -- names ------------------------------------------------------------

    def _topic_name(self, topic: str) -> str:
        if self._layout == layouts.LAYOUT_9:
            return _composed(layout9.topic_shm_name, self._prefix, topic)
        return f"/{self._prefix}_{topic}"

    def _broadcast_name(self, channel: str) -> str:
        if self._layout == layouts.LAYOUT_9:
            return _composed(layout9.broadcast_shm_name, self._prefix, channel)
        return f"/{self._prefix}_broadcast_{channel}"

    def _mailbox_name(self, owner: str, tag: str) -> str:
        if self._layout == layouts.LAYOUT_9:
            return _composed(layout9.mailbox_shm_name, self._prefix, owner, tag)
        return f"/{self._prefix}_{owner}_mbx_{tag}"

    def _identity(self, kind: str, *names: str) -> int:
        """The identity a layout-9 region of this node is stamped with (A.9); 0 on layout 4."""
        if self._layout != layouts.LAYOUT_9:
            return 0
        if kind == "topic":
            return layout9.topic_identity(self._prefix, names[0])
        if kind == "broadcast":
            return layout9.broadcast_identity(self._prefix, names[0])
        return layout9.mailbox_identity(self._prefix, layout9.sanitize_component(names[0], "mailbox owner"), names[1])

    def _stamped(self, cfg: Config | None, identity: int) -> Config:
        """A copy of ``cfg`` (default Config()) carrying ``identity``."""
        stamped = copy.copy(cfg or Config())
        stamped.identity = identity
        return stamped

    # -- the three ways to get a region -------------------------------------

    def _create(self, shm_name: str, channel_type: ChannelType, cfg: Config) -> SharedRegion:
        region = SharedRegion.create(shm_name, channel_type, cfg, self._name, layout=self._layout)
        self._regions[shm_name] = region
        return region

    def _mapped(self, shm_name: str) -> SharedRegion | None:
        """The region this node mapped for the name, unless it was re-created
        since (in place, or as another object)."""
        region = self._regions.get(shm_name)
        return region if region is not None and not region.replaced() else None

    def _open(self, shm_name: str, identity: int) -> SharedRegion:
        region = self._mapped(shm_name) or SharedRegion.open(shm_name, identity)
        self._regions[shm_name] = region
        return region

    def _create_or_open(self, shm_name: str, channel_type: ChannelType, cfg: Config) -> SharedRegion:
        region = self._mapped(shm_name) or SharedRegion.create_or_open(
            shm_name, channel_type, cfg, self._name, layout=self._layout
        )
        self._regions[shm_name] = region
        return region

    # -- the participant registry (layout 9) --------------------------------------

    def _registered(self, handle: Handle, shm_name: str, path: str, kind: Kind, role: Role) -> Handle:
        """Record ``role`` on ``shm_name`` in the registry (layout 9 only) and
        let ``handle`` keep this node alive; returns ``handle``."""
        if self._rows is not None:
            self._rows.register(shm_name, path, kind, role)
            _NODE_OF_HANDLE[handle] = self
        return handle

    # -- PubSub ---------------------------------------------------------------

    def advertise(self, topic: str, cfg: Config | None = None) -> Publisher:
        """Create the topic's region (replacing any) and publish into it."""
        cfg = self._stamped(cfg, self._identity("topic", topic))
        shm_name = self._topic_name(topic)
        pub = Publisher(self._create(shm_name, ChannelType.PubSub, cfg), name=self._name)
        return self._registered(pub, shm_name, topic, Kind.Pubsub, Role.Publisher)

    def subscribe(self, topic: str) -> Subscriber:
        """Open an existing topic and subscribe to it."""
        shm_name = self._topic_name(topic)
        sub = Subscriber(self._open(shm_name, self._identity("topic", topic)))
        return self._registered(sub, shm_name, topic, Kind.Pubsub, Role.Subscriber)

    def advertise_or_join(self, topic: str, cfg: Config) -> Publisher:
        """Publish into the topic, creating it unless it exists with this config."""
        cfg = self._stamped(cfg, self._identity("topic", topic))
        shm_name = self._topic_name(topic)
        pub = Publisher(self._create_or_open(shm_name, ChannelType.PubSub, cfg), name=self._name)
        return self._registered(pub, shm_name, topic, Kind.Pubsub, Role.Publisher)

    def subscribe_or_create(self, topic: str, cfg: Config) -> Subscriber:
        """Subscribe to the topic, creating it unless it exists with this config."""
        cfg = self._stamped(cfg, self._identity("topic", topic))
        shm_name = self._topic_name(topic)
        sub = Subscriber(self._create_or_open(shm_name, ChannelType.PubSub, cfg))
        return self._registered(sub, shm_name, topic, Kind.Pubsub, Role.Subscriber)

    def unlink_topic(self, topic: str) -> None:
        unlink_shm(self._topic_name(topic))

    # -- Broadcast --------------------------------------------------------------

    def join_broadcast(self, channel: str, cfg: Config | None = None) -> BroadcastHandle:
        """Join an N-to-N channel as both publisher and subscriber."""
        cfg = self._stamped(cfg, self._identity("broadcast", channel))
        shm_name = self._broadcast_name(channel)
        region = self._create_or_open(shm_name, ChannelType.Broadcast, cfg)
        handle = BroadcastHandle(Publisher(region, name=self._name), Subscriber(region))
        return self._registered(handle, shm_name, channel, Kind.Broadcast, Role.Both)

    def unlink_broadcast(self, channel: str) -> None:
        unlink_shm(self._broadcast_name(channel))

    # -- Mailbox ----------------------------------------------------------------

    def create_mailbox(self, tag: str, cfg: Config | None = None) -> Subscriber:
        """Create this node's mailbox ``tag`` (one subscriber: us) and read it."""
        mailbox_cfg = self._stamped(cfg, self._identity("mailbox", self._name, tag))
        mailbox_cfg.max_subscribers = 1
        shm_name = self._mailbox_name(self._name, tag)
        sub = Subscriber(self._create(shm_name, ChannelType.PubSub, mailbox_cfg))
        return self._registered(sub, shm_name, self._mailbox_path(self._name, tag), Kind.Mailbox, Role.Subscriber)

    def open_mailbox(self, owner_node: str, tag: str) -> Publisher:
        """Write into another node's mailbox."""
        identity = self._identity("mailbox", owner_node, tag)
        shm_name = self._mailbox_name(owner_node, tag)
        pub = Publisher(self._open(shm_name, identity), name=self._name)
        return self._registered(pub, shm_name, self._mailbox_path(owner_node, tag), Kind.Mailbox, Role.Publisher)

    @staticmethod
    def _mailbox_path(owner_node: str, tag: str) -> str:
        """A mailbox's registry path (A.11): "/" + sanitized owner + "/" + raw tag."""
        return f"/{layout9.sanitize_component(owner_node, 'mailbox owner')}/{tag}"

    def unlink_mailbox(self, tag: str, owner_node: str | None = None) -> None:
        unlink_shm(self._mailbox_name(owner_node or self._name, tag))

    # -- Blackboard (layout 9) ---------------------------------------------------------

    def blackboard(self, name: str, cfg: BlackboardConfig | None = None) -> Blackboard:
        """Open or create the namespace's board ``name`` (this node's name is
        its default key owner) and register it (Blackboard, Both)."""
        if self._rows is None:
            raise LayoutError(f"Node {self._name!r} is on layout {self._layout}: a Blackboard needs a layout-9 node")
        board = Blackboard.open_or_create(self._prefix, name, cfg, owner_name=self._name)
        return self._registered(board, board.name, name, Kind.Blackboard, Role.Both)

    def unlink_blackboard(self, name: str) -> None:
        Blackboard.unlink(self._prefix, name)

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
        return f"Node(name={self._name!r}, prefix={self._prefix!r}, layout={self._layout}, regions={sorted(self._regions)})"


def _deregister_rows(rows: NodeRows, pid: int) -> None:
    """Give back a gone node's rows, unless this is a fork child of the
    process that registered them (its copy of the node goes, theirs stays)."""
    if os.getpid() == pid:
        rows.deregister_all()


def _composed(compose: Callable[..., str], *parts: str) -> str:
    """A layout-9 shm name (A.11); too long is 0.9.2's RuntimeError."""
    try:
        return compose(*parts)
    except OSError as error:
        raise RuntimeError(f"{error.strerror}: File name too long") from None
