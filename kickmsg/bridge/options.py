"""A bridge's options: from the command line (``kickmsg.cli.bridging``), a
TOML file (``load_file``) or a program (``BridgeOptions``), checked before
anything starts (``check_options``), and the Zenoh config made of them.
"""
import dataclasses
import json
import re
import socket
import tomllib
from typing import Any

from kickmsg.config import Config
from kickmsg.errors import BridgeError
from kickmsg.layouts import check_layout
from kickmsg.shm import check_name
from kickmsg.userfiles import read_at_most

__all__ = [
    "BridgeOptions", "CONFIG_LIMIT", "EXTRA", "FILE_KEYS", "GEOMETRY_KEYS", "ImportSpec", "MAX_STATS_INTERVAL_S",
    "MODES", "RUST_LOCATION", "check_endpoint", "check_key", "check_options", "default_key_prefix", "export_key",
    "load_file", "parse_import", "shm_name", "zenoh_config", "zenoh_module", "zenoh_text",
]

EXTRA = "pip install 'kickmsg-py[bridge]'"
MODES = ("peer", "client", "router")
MAX_STATS_INTERVAL_S = 1e6  # beyond, the wait overflows the platform's timeouts
RUST_LOCATION = re.compile(r" at \S+\.rs:\d+\.?")  # where in Zenoh's source an error was raised


def zenoh_module() -> Any:
    """The ``zenoh`` module, or a clear error naming the extra."""
    try:
        import zenoh
    except ImportError as error:
        raise BridgeError(f"cannot import zenoh ({error}); install the bridge extra: {EXTRA}") from None
    return zenoh


@dataclasses.dataclass
class ImportSpec:
    """A Zenoh key written into a local channel; ``config`` (geometry only),
    when given, replaces the geometry that travels with the messages, and
    ``layout`` (4 or 9), when given, the layout it describes."""

    key: str
    name: str
    config: Config | None = None
    layout: int | None = None


@dataclasses.dataclass
class BridgeOptions:
    exports: list[str] = dataclasses.field(default_factory=list)
    imports: list[ImportSpec] = dataclasses.field(default_factory=list)
    key_prefix: str = ""
    listen: list[str] = dataclasses.field(default_factory=list)
    connect: list[str] = dataclasses.field(default_factory=list)
    mode: str = "peer"
    multicast_scouting: bool = False
    stats_interval: float | None = None
    zenoh: dict[str, Any] = dataclasses.field(default_factory=dict)  # JSON5 paths -> values, for zenoh.Config


def default_key_prefix() -> str:
    return f"kickmsg/{socket.gethostname()}"


def shm_name(text: str) -> str:
    """``kickmsg_imu`` or ``/kickmsg_imu`` -> ``/kickmsg_imu``."""
    name = text if text.startswith("/") else "/" + text
    check_name(name)
    return name


def check_key(key: str, what: str) -> str:
    """A Zenoh key usable to publish on: non-empty chunks, no wildcards."""
    chunks = key.split("/")
    if not key or any(not chunk for chunk in chunks) or any(c in key for c in "*$?#"):
        raise ValueError(f"invalid {what} {key!r}: slash-separated chunks without wildcards (* $ ? #)")
    if any(chunk.startswith("@") for chunk in chunks):
        raise ValueError(f"invalid {what} {key!r}: chunks starting with @ are reserved")
    return key


def parse_import(text: str) -> ImportSpec:
    """``KEY=NAME`` of ``--import``."""
    key, equals, name = text.partition("=")
    if not equals or not key or not name:
        raise ValueError(f"invalid --import {text!r}: KEY=NAME, e.g. kickmsg/robot/kickmsg_imu=/kickmsg_imu")
    return ImportSpec(check_key(key, "import key"), shm_name(name))


CONFIG_LIMIT = 1024 * 1024  # bytes of a bridge config file
GEOMETRY_KEYS = ("max_subscribers", "sub_ring_capacity", "pool_size", "max_payload_size", "commit_timeout")
FILE_KEYS = {"key_prefix", "listen", "connect", "mode", "multicast_scouting", "stats_interval", "export", "import", "zenoh"}


def load_file(path: str) -> BridgeOptions:
    """Options from a TOML file (docs/how-to/bridge.md lists its keys)."""
    try:
        data = tomllib.loads(read_at_most(path, CONFIG_LIMIT, "the limit of a bridge config").decode("utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read bridge config {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"invalid TOML in bridge config {path}: {error}") from None
    unknown = sorted(set(data) - FILE_KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} in bridge config {path} (known: {', '.join(sorted(FILE_KEYS))})")
    options = BridgeOptions(
        key_prefix=data.get("key_prefix", ""), listen=list(data.get("listen", [])), connect=list(data.get("connect", [])),
        mode=data.get("mode", "peer"), multicast_scouting=bool(data.get("multicast_scouting", False)),
        stats_interval=data.get("stats_interval"), zenoh=dict(data.get("zenoh", {})),
        exports=[shm_name(name) for name in data.get("export", [])],
    )
    for table in data.get("import", []):
        if "key" not in table or "name" not in table:
            raise ValueError(f"an [[import]] of bridge config {path} needs 'key' and 'name', got {sorted(table)}")
        extra = sorted(set(table) - {"key", "name", "layout", *GEOMETRY_KEYS})
        if extra:
            raise ValueError(f"unknown key {extra[0]!r} in an [[import]] of {path} (known: key, name, layout, {', '.join(GEOMETRY_KEYS)})")
        geometry = {key: table[key] for key in GEOMETRY_KEYS if key in table}
        spec = ImportSpec(check_key(table["key"], "import key"), shm_name(table["name"]))
        spec.config = Config(**geometry) if geometry else None
        spec.layout = check_layout(table["layout"], f"the layout of an [[import]] of {path}") if "layout" in table else None
        options.imports.append(spec)
    return options


def check_endpoint(endpoint: str) -> None:
    """Refuse an IP endpoint whose port cannot exist (Zenoh would retry it
    forever without a word): ``tcp/HOST:PORT``, ``udp/...``, ``quic/...``."""
    protocol, _, address = endpoint.partition("/")
    if protocol in ("tcp", "udp", "quic", "tls"):
        _, _, port = address.split("?")[0].split("#")[0].rpartition(":")  # metadata (?...) and config (#...) aside
        if not (port.isdigit() and 0 <= int(port) <= 65535):
            raise ValueError(f"invalid endpoint {endpoint!r}: {protocol}/HOST:PORT with a port from 0 to 65535")


def check_options(options: BridgeOptions) -> None:
    """Refuse what cannot work, loops first."""
    check_key(options.key_prefix, "key prefix")
    if options.mode not in MODES:
        raise ValueError(f"invalid Zenoh mode {options.mode!r}: one of {', '.join(MODES)}")
    if not options.exports and not options.imports:
        raise ValueError("nothing to bridge: give --export NAME or --import KEY=NAME")
    if not (options.listen or options.connect or options.multicast_scouting or options.mode == "client"):
        raise ValueError("no way to reach another host: give --listen ENDPOINT, --connect ENDPOINT or --scout")
    for endpoint in options.listen + options.connect:
        check_endpoint(endpoint)
    if options.stats_interval is not None and not 0 < options.stats_interval <= MAX_STATS_INTERVAL_S:
        raise ValueError(f"stats_interval must be greater than 0 and at most {MAX_STATS_INTERVAL_S:g}, not {options.stats_interval}")
    for name in options.exports:
        if options.exports.count(name) > 1:
            raise ValueError(f"channel {name} is exported twice")
    imported = [spec.name for spec in options.imports]
    export_keys = {export_key(options.key_prefix, name) for name in options.exports}
    for spec in options.imports:
        if imported.count(spec.name) > 1:
            raise ValueError(f"channel {spec.name} is imported twice: one key per local channel")
        if spec.name in options.exports:
            raise ValueError(f"channel {spec.name} is both exported and imported: the bridge would forward back what it received")
        if spec.key in export_keys:
            raise ValueError(f"key {spec.key} is one this bridge exports: importing it would loop")


def export_key(prefix: str, name: str) -> str:
    return f"{prefix}/{name[1:]}"


def zenoh_config(options: BridgeOptions) -> Any:
    """The Zenoh session's config: mode, endpoints, scouting, then the file's
    ``[zenoh]`` table (JSON5 paths, e.g. ``"transport/link/tx/lease"``)."""
    zenoh = zenoh_module()
    config = zenoh.Config()
    settings: dict[str, Any] = {
        "mode": options.mode,
        "listen/endpoints": options.listen,
        "connect/endpoints": options.connect,
        "scouting/multicast/enabled": options.multicast_scouting,
        "transport/shared_memory/enabled": False,  # for Zenoh peers on one host; left /dev/shm/*.zenoh behind
        **options.zenoh,
    }
    for path, value in settings.items():
        try:
            config.insert_json5(path, json.dumps(value))
        except Exception as error:  # zenoh raises its own ZError
            raise ValueError(f"invalid Zenoh setting {path} = {value!r}: {zenoh_text(error)}") from None
    return config


def zenoh_text(error: Exception) -> str:
    """A Zenoh error's message without the Rust source locations it carries
    (`` at /root/.cargo/.../endpoint.rs:615.``)."""
    return RUST_LOCATION.sub("", str(error)).strip()
