"""A recording's files, shared by their writers and readers: the columns of
a message row, the metadata key naming the recording, the two formats
(Parquet, MCAP) told apart by their magic bytes, and the files of a
recording directory.
"""
import os

import pyarrow

from kickmsg.errors import RecordingError

__all__ = [
    "CLOSING", "COLUMNS", "EARLIER_COLUMNS", "FORMATS", "MCAP_MAGIC", "PARQUET_MAGIC", "PARTIAL", "SCHEMA_KEY", "file_format",
    "recording_files",
]

SCHEMA_KEY = b"kickmsg.recording"
COLUMNS = [
    ("recording", pyarrow.string()),
    ("channel", pyarrow.string()),
    ("ring_pos", pyarrow.int64()),
    ("recv_mono_ns", pyarrow.int64()),
    ("recv_wall_ns", pyarrow.int64()),
    ("size", pyarrow.int32()),
    ("lost", pyarrow.int64()),
    ("stamp_ns", pyarrow.int64()),
    ("rejoined", pyarrow.int32()),
    ("payload", pyarrow.binary()),
]
EARLIER_COLUMNS = [column for column in COLUMNS if column[0] != "rejoined"]  # recorded before rejoined existed
FORMATS = ("parquet", "mcap")
MCAP_MAGIC = b"\x89MCAP0\r\n"  # the first 8 bytes of an MCAP file
PARQUET_MAGIC = b"PAR1"  # the first (and last) 4 bytes of a Parquet file
PARTIAL = ".partial"  # suffix of a file being written
CLOSING = ".closing"  # suffix of a complete file being written from a .partial one, renamed when done


def recording_files(path: str) -> list[str]:
    """The Parquet or MCAP files of a recording directory (or a single file), in order."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise ValueError(f"no such file or directory: {path}")
    files = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith((".parquet", ".mcap")))
    if not files:
        raise ValueError(f"no .parquet or .mcap files in {path}")
    return files


def file_format(file: str) -> str:
    """``mcap`` or ``parquet``, by the file's magic bytes; anything else is
    refused naming the file."""
    with open(file, "rb") as head:
        magic = head.read(8)
    if magic == MCAP_MAGIC:
        return "mcap"
    if magic[:4] == PARQUET_MAGIC:
        return "parquet"
    raise RecordingError(f"{file} is not a recording: neither a Parquet nor an MCAP file")
