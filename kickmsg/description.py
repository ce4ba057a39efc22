"""A channel's description as JSON values: its type, geometry and schema
descriptor, which is what re-creating it elsewhere needs. Recordings keep
one per channel (to play them into fresh channels) and ``kickmsg bridge``
sends one to the importing side; the CLI and ``kickmsg.ops.diagnostics`` show
the schema part."""
from typing import Any

from kickmsg import layouts
from kickmsg.config import ChannelType, Config
from kickmsg.region import SharedRegion
from kickmsg.schema import SchemaInfo

__all__ = ["channel_config", "describe", "described_layout", "schema_from_json", "schema_to_json"]


def schema_to_json(info: SchemaInfo) -> dict[str, Any]:
    """A schema descriptor as JSON values (the hashes in hex)."""
    return {
        "name": info.name,
        "version": info.version,
        "identity": info.identity.hex(),
        "layout": info.layout.hex(),
        "identity_algo": info.identity_algo,
        "layout_algo": info.layout_algo,
        "flags": info.flags,
    }


def schema_from_json(data: dict[str, Any]) -> SchemaInfo:
    """The schema descriptor ``schema_to_json`` gave."""
    return SchemaInfo(
        identity=bytes.fromhex(data["identity"]), layout=bytes.fromhex(data["layout"]), name=data["name"],
        version=data["version"], identity_algo=data["identity_algo"], layout_algo=data["layout_algo"],
        flags=data["flags"],
    )


def describe(region: SharedRegion) -> dict[str, Any]:
    """The channel's layout, type (its number), geometry and schema (or None)."""
    g = region.geometry
    schema = region.schema()
    return {
        "layout": region.layout,
        "channel_type": g.channel_type,
        "max_subscribers": g.max_subs,
        "sub_ring_capacity": g.capacity,
        "pool_size": g.pool_size,
        "max_payload_size": g.slot_data_size,
        "commit_timeout_us": g.commit_timeout_us,
        "schema": None if schema is None else schema_to_json(schema),
    }


def described_layout(description: dict[str, Any]) -> int:
    """The layout of the channel a description stands for: 4 for one made
    before descriptions carried it (everything was layout 4 then)."""
    return layouts.check_layout(description.get("layout", layouts.LAYOUT_4), "the description's layout")


def channel_config(description: dict[str, Any], geometry: Config | None = None) -> tuple[ChannelType, Config]:
    """The channel type and Config a description stands for; with
    ``geometry``, its geometry instead (the schema is always the
    description's)."""
    schema = description["schema"]
    info = None if schema is None else schema_from_json(schema)
    if geometry is not None:
        config = Config(
            max_subscribers=geometry.max_subscribers, sub_ring_capacity=geometry.sub_ring_capacity,
            pool_size=geometry.pool_size, max_payload_size=geometry.max_payload_size,
            commit_timeout=geometry.commit_timeout, schema=info,
        )
    else:
        config = Config(
            max_subscribers=description["max_subscribers"], sub_ring_capacity=description["sub_ring_capacity"],
            pool_size=description["pool_size"], max_payload_size=description["max_payload_size"],
            commit_timeout=description["commit_timeout_us"] / 1e6, schema=info,
        )
    return ChannelType(description["channel_type"]), config
