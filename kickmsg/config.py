"""Channel configuration: ChannelType and Config, as the native binding has them."""
import datetime
import enum
import math
from typing import Any

from kickmsg.errors import ConfigError
from kickmsg.protocol.v4 import layout
from kickmsg.schema import SchemaInfo

__all__ = ["ChannelType", "Config", "MAX_POOL_SIZE", "MAX_SUBSCRIBERS", "to_microseconds"]


# Our bounds on a region this package creates (0.1.0 has none): every
# publish visits every ring, create lays out every slot, and the tools read
# every ring's header and every slot's refcount.
MAX_SUBSCRIBERS = 1024
MAX_POOL_SIZE = 1 << 20


class ChannelType(enum.IntEnum):
    """What a region is for; stored in the header as ``channel_type``."""

    NoChannel = 0  # 0.9.2's: no region is made of it
    PubSub = layout.CHANNEL_PUBSUB
    Broadcast = layout.CHANNEL_BROADCAST

    __str__ = enum.Enum.__str__  # "ChannelType.PubSub", as the native binding prints


def channel_type_of(type: int) -> ChannelType:
    """A channel type a region can be made of (not ``NoChannel``)."""
    if type in (ChannelType.PubSub, ChannelType.Broadcast) and not isinstance(type, bool):
        return ChannelType(type)
    raise ConfigError(f"channel type must be ChannelType.PubSub or ChannelType.Broadcast, got {type!r}")


def to_microseconds(duration: datetime.timedelta | float, what: str) -> int:
    """A non-negative duration (timedelta or seconds) in whole microseconds."""
    if isinstance(duration, datetime.timedelta):
        micros = duration // datetime.timedelta(microseconds=1)
    elif isinstance(duration, (int, float)) and not isinstance(duration, bool):
        if not math.isfinite(duration):  # int() of it would raise OverflowError (inf) or a ValueError naming nothing (nan)
            raise ValueError(f"{what} must be a finite number of seconds, got {duration!r}")
        micros = int(duration * 1_000_000)  # truncated, as 0.1.0 does: it is hashed
    else:
        raise TypeError(f"{what} must be a datetime.timedelta or seconds as a float, got {duration!r}")
    if micros < 0:
        raise ValueError(f"{what} must not be negative, got {duration!r}")
    return micros


class Config:
    """Geometry of a new channel. Defaults are 0.1.0's.

    ``Config()`` then attribute assignment works as in the native binding;
    keyword arguments are accepted as well: ``Config(pool_size=64)``.
    ``commit_timeout`` reads as a ``timedelta`` and accepts a timedelta or
    float seconds. Counts are checked when a region is created.
    """

    commit_timeout_us: int  # stored by the commit_timeout setter
    _COUNT_FIELDS = ("max_subscribers", "sub_ring_capacity", "pool_size", "max_payload_size")

    def __init__(
        self,
        *,
        max_subscribers: int = 16,
        sub_ring_capacity: int = 64,
        pool_size: int = 256,
        max_payload_size: int = 4096,
        commit_timeout: datetime.timedelta | float = datetime.timedelta(
            microseconds=layout.DEFAULT_COMMIT_TIMEOUT_US
        ),
        schema: SchemaInfo | None = None,
        identity: int = 0,
    ) -> None:
        self.max_subscribers = max_subscribers
        self.sub_ring_capacity = sub_ring_capacity
        self.pool_size = pool_size
        self.max_payload_size = max_payload_size
        self.commit_timeout = commit_timeout
        self.schema = schema
        self.identity = identity

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._COUNT_FIELDS:
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Config.{name} must be an int, got {value!r}")
            if not 0 <= value <= layout.U64_MAX:
                raise ConfigError(f"Config.{name} must be an unsigned 64-bit integer, got {value}")
        elif name == "identity":  # 0.9.2's: stamped in a layout-9 header, checked by open(expected_identity)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Config.identity must be an int, got {value!r}")
            if not 0 <= value <= layout.U64_MAX:
                raise ConfigError(f"Config.identity must be an unsigned 64-bit integer, got {value}")
        elif name == "commit_timeout":
            pass  # the property's setter converts it
        elif name == "schema":
            if value is not None and not isinstance(value, SchemaInfo):
                raise TypeError(f"Config.schema must be a SchemaInfo or None, got {value!r}")
        else:
            raise AttributeError(f"Config has no field {name!r}")
        object.__setattr__(self, name, value)

    @property
    def commit_timeout(self) -> datetime.timedelta:
        return datetime.timedelta(microseconds=self.commit_timeout_us)

    @commit_timeout.setter
    def commit_timeout(self, duration: datetime.timedelta | float) -> None:
        try:
            micros = to_microseconds(duration, "Config.commit_timeout")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        object.__setattr__(self, "commit_timeout_us", micros)

    def validation_error(self) -> str | None:
        """Why a region cannot be made or joined with this config, or None:
        0.1.0's rules (its message texts first), plus the limits of the
        32-bit wire fields. Each names the field and the value."""
        if not self.sub_ring_capacity or self.sub_ring_capacity & (self.sub_ring_capacity - 1):
            return f"sub_ring_capacity must be a power of 2 (got {self.sub_ring_capacity})"
        if self.pool_size == 0:
            return "pool_size must be > 0 (got 0)"
        if self.max_subscribers == 0:
            return "max_subscribers must be > 0 (got 0)"
        if self.max_payload_size == 0:
            return "max_payload_size must be > 0 (got 0)"
        if self.pool_size >= layout.INVALID_SLOT:
            return f"pool_size must be < {layout.INVALID_SLOT} (slot indices are 32-bit), got {self.pool_size}"
        if self.max_payload_size > layout.U32_MAX - layout.SLOT_HEADER_SIZE:
            return f"max_payload_size must fit a 32-bit length, got {self.max_payload_size}"
        if self.max_subscribers > layout.U32_MAX:
            return f"max_subscribers must fit a 32-bit refcount, got {self.max_subscribers}"
        if self.commit_timeout_us > layout.MAX_COMMIT_TIMEOUT_US:
            return f"commit_timeout must be at most 1 day, got {self.commit_timeout_us} us"
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return vars(self) == vars(other)

    def __repr__(self) -> str:
        schema = f", schema={self.schema!r}" if self.schema is not None else ""
        schema += f", identity=0x{self.identity:016x}" if self.identity else ""
        return (
            f"Config(max_subscribers={self.max_subscribers}, sub_ring_capacity={self.sub_ring_capacity}, "
            f"pool_size={self.pool_size}, max_payload_size={self.max_payload_size}, "
            f"commit_timeout={self.commit_timeout_us / 1e6:g}s{schema})"
        )
