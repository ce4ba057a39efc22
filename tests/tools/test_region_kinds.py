"""What the channel commands and ``info`` say of regions that are not
channels or do not open: a participant registry or a Blackboard is named,
with the command that reads it; ``info`` on a damaged, truncated or
unsupported region shows the header fields that parse and the fault, and no
bytes (forged, truncated, random) nor a FIFO in their place make a command
crash or hang."""
import json
import os
import random
import struct

import pytest

from kickmsg import ChannelType, Config, Node, SharedRegion, cli, shm
from kickmsg.ops import diagnostics
from kickmsg.protocol.v4 import layout
from kickmsg.protocol.v9 import blackboard as board9
from kickmsg.protocol.v9 import registry as registry9

pytestmark = pytest.mark.timeout(120)

CHANNEL_MAGIC = layout.MAGIC
SMALL = Config(max_subscribers=2, sub_ring_capacity=8, pool_size=16, max_payload_size=64)


@pytest.fixture
def prefix():
    """A name prefix of this module's own; every object under it is removed
    after the test, whatever its outcome."""
    value = f"hrd_kinds_{os.getpid()}"
    yield value
    for entry in os.scandir(shm.SHM_DIRECTORY):
        if entry.name.startswith(value):
            os.unlink(entry.path)


def command(capsys, *words: str) -> tuple[int, str, str]:
    """``kickmsg WORDS`` in this process: status, stdout, stderr."""
    capsys.readouterr()
    status = cli.main(list(words))
    out, err = capsys.readouterr()
    return status, out, err


def test_channel_commands_on_a_blackboard_or_a_registry_name_it_and_the_command_that_reads_it(prefix, capsys, tmp_path):
    node = Node("kinds", namespace=prefix, layout=9)
    board = node.blackboard("cfg")
    board_name, registry_name = f"/{prefix}_bb_cfg", f"/{prefix}_registry"
    assert os.path.exists(shm.SHM_DIRECTORY + board_name) and os.path.exists(shm.SHM_DIRECTORY + registry_name)
    said = {
        board_name: f"{board_name} is a Blackboard (layout 9), not a channel: kickmsg bb cfg -n {prefix} reads it",
        registry_name: f"{registry_name} is a participant registry (layout 9), not a channel: kickmsg registry {prefix} reads it",
    }
    for name, sentence in said.items():
        for words in (["echo", name, "--count", "1"], ["diagnose", name], ["audit", name], ["stats", name], ["pub", name, "x"],
                      ["record", name, "--out", str(tmp_path), "--duration", "1"]):
            status, out, err = command(capsys, *words)
            assert (status, out, err) == (2, "", f"kickmsg {words[0]}: error: {sentence}\n"), words
    assert command(capsys, "bb", "cfg", "-n", prefix)[0] == 0
    assert command(capsys, "registry", prefix)[0] == 0
    assert not list(tmp_path.iterdir()), "record wrote nothing"
    del board, node


def forged(prefix: str) -> None:
    """Damaged regions made from real ones of both layouts: truncated, cut
    inside the header, a header field that no longer fits; an unsupported
    version."""
    made = {}
    for layout in (4, 9):
        good_name = f"/{prefix}_good{layout}"
        SharedRegion.create(good_name, ChannelType.PubSub, SMALL, "forger", layout=layout)
        with open(shm.SHM_DIRECTORY + good_name, "rb") as file:
            good = file.read()
        made[f"/{prefix}_trunc{layout}"] = good[:len(good) // 2]
        made[f"/{prefix}_half{layout}"] = good[:400]
        rings = bytearray(good)
        struct.pack_into("<Q", rings, 40, 99)  # max_subs: 99 rings do not fit before the pool
        made[f"/{prefix}_rings{layout}"] = bytes(rings)
    made[f"/{prefix}_v7"] = struct.pack("<QI", CHANNEL_MAGIC, 7) + bytes(900)
    for name, data in made.items():
        with open(shm.SHM_DIRECTORY + name, "wb") as file:
            file.write(data)


def test_info_on_a_damaged_region_shows_the_fields_that_parse_and_the_fault(prefix, capsys):
    forged(prefix)
    rows = {row.name: row for row in diagnostics.list_regions(prefix)}
    assert {rows[f"/{prefix}_{label}"].type for label in ("trunc4", "trunc9", "half4", "half9", "rings4", "rings9")} == {"damaged"}

    status, out, err = command(capsys, "info", f"/{prefix}_rings9")
    lines = out.splitlines()
    assert (status, err) == (1, "")
    assert lines[0].startswith(f"/{prefix}_rings9 does not open: Header geometry: subscriber rings overflow pool_offset")
    assert lines[1:4] == ["type               channel", "size               3456 bytes", "version            9"]
    assert "max_subs           99" in lines and "creator_name       forger" in lines and "pool_size          16" in lines
    assert lines[-1] == f"kickmsg rm /{prefix}_rings9 removes it"

    status, out, _ = command(capsys, "info", f"/{prefix}_half4", "--json")
    found = json.loads(out)
    assert status == 1
    assert (found["type"], found["size"], found["version"], found["creator_name"]) == ("channel", 400, 4, None)
    assert found["fields"]["pool_size"] == 16 and found["fields"]["creator_pid"] == os.getpid()
    assert found["missing"] == ["free_top"] and "truncated: 400 bytes" in found["fault"]

    status, out, _ = command(capsys, "info", f"/{prefix}_v7")
    assert status == 1 and out.splitlines()[1:] == ["type               channel", "size               912 bytes", "version            7"]


def hostile(prefix: str, count: int) -> list[str]:
    """Objects with a Kickmsg magic (channel, registry, blackboard), a
    version among those read and others, and random bytes of random
    sizes."""
    chooser = random.Random(34)
    names = []
    for index in range(count):
        magic = chooser.choice([CHANNEL_MAGIC, registry9.MAGIC, board9.MAGIC])
        version = chooser.choice([0, 1, 2, 4, 9, 0xFFFFFFFF])
        size = chooser.choice([8, 9, 12, 100, 832, 900, 4096])
        name = f"/{prefix}_random{index}"
        with open(shm.SHM_DIRECTORY + name, "wb") as file:
            file.write((struct.pack("<QI", magic, version) + chooser.randbytes(size))[:size])
        names.append(name)
    return names


def test_no_bytes_make_info_or_the_channel_commands_crash_or_hang(prefix, capsys):
    for name in hostile(prefix, 24):
        for words in (["info", name], ["info", name, "--json"], ["stats", name], ["audit", name], ["diagnose", name]):
            status, out, err = command(capsys, *words)
            assert status in (0, 1, 2), (words, status, out, err)  # (random bytes that parse), damage found, an error
            if status == 2:
                assert err.count("\n") == 1 and err.startswith(f"kickmsg {words[0]}: error: "), (words, err)
    os.mkfifo(shm.SHM_DIRECTORY + f"/{prefix}_fifo")  # opening it for reading would block
    for words in (["info"], ["stats"], ["echo", "--count", "1"], ["rm"]):
        status, _, err = command(capsys, words[0], f"/{prefix}_fifo", *words[1:])
        assert (status, err.split(": error: ")[1]) == (2, f"not a Kickmsg region: /{prefix}_fifo" + (" (--force removes it anyway)" if words == ["rm"] else "") + "\n")
