"""Regions from the ``kickmsg`` command: list (damaged and unreadable
objects, --all, mode and owner, JSON numbers), clean of orphan sidecars,
create, rm, pub --create, repair's sentences, the findings of stats,
diagnose, audit and info (dead subscribers, pools too small for their
rings), and ``python -m kickmsg``.

Every command runs as a real subprocess; regions of the native library are
made by native children; dead subscribers are real processes killed with
SIGKILL. Expected values come from what the test did and from ``rawregion``.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

import rawregion
from conftest import on_layout4
from kickmsg import Config, SharedRegion, Subscriber
from kickmsg import owners
from nativepeer import run_native, start_native, start_ours
from test_cli import (
    MAGIC, access, assert_one_line_error, cli, cli_json, command_line, create_in_child, live_rings,
    make, poke, snapshot,
)
from test_cli import NATIVE_SUBSCRIBER as HOLD_A_RING  # any implementation: subscribe, wait to be told, leave
from test_cli import name, prefix  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(120)

UNLINK = r"""
kickmsg.unlink_shm(P["name"])
done("ok")
"""
PUBSUB, BROADCAST = 1, 2  # channel_type in the header
HAZARD = "pool_size (8) must be greater than sub_ring_capacity (8)"


def exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm{name}")


# -- list ----------------------------------------------------------------------------------------


@on_layout4
def test_list_keeps_the_table_readable_around_a_damaged_region(prefix):
    """A damaged region is a row with a short status and '-' cells, and a
    footer points at kickmsg info; --json gives the reason in 'problem'."""
    good, damaged = f"/{prefix}_a_good", f"/{prefix}_b_damaged"
    make(good)
    make(damaged)
    poke(damaged, 64, "<Q", 10**6)  # pool_size far beyond the object
    result = cli("list", "--prefix", prefix)
    assert result.code == 0
    header, first, second, footer, publishers = result.text.splitlines()
    assert first.split()[:2] == [good, "PubSub"]
    assert second.split() == [damaged, "damaged", "4", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-",
                              access(damaged)["mode"], access(damaged)["owner"]]
    assert footer == "kickmsg info NAME for details on damaged or unsupported regions"
    assert publishers == "PUBS: live publishers of this package (+ unrecorded: native publishers cannot be seen)"
    rows = cli_json("list", "--prefix", prefix)
    assert rows[0]["problem"] is None
    assert rows[1]["type"] == "damaged" and rows[1]["problem"].startswith(f"Region {damaged} does not fit its mapping")
    detail = cli("info", damaged)  # what parses, and the fault
    assert detail.code == 1 and detail.text.startswith(f"{damaged} does not open: Region {damaged} does not fit its mapping")
    assert "pool_size          1000000" in detail.text.splitlines()


@on_layout4
def test_list_all_shows_orphan_sidecars_and_other_objects(prefix):
    """--all adds objects that are not Kickmsg regions and sidecars whose
    region is gone, each with its status; a region's own sidecar is never a row."""
    region_name, garbage, orphan = f"/{prefix}_a_region", f"/{prefix}_b_garbage", f"/{prefix}_c_gone.owners"
    region = make(region_name)
    subscriber = Subscriber(region)  # gives the region a sidecar
    assert os.path.exists(owners.sidecar_path(region_name))
    pathlib.Path(f"/dev/shm{garbage}").write_bytes(b"not a region" * 10)
    pathlib.Path(f"/dev/shm{orphan}").write_bytes(bytes(48))

    assert [row["name"] for row in cli_json("list", "--prefix", prefix)] == [region_name]
    rows = cli_json("list", "--prefix", prefix, "--all", "-o", "name,type,subs,mode,owner,problem")
    assert rows == [
        dict(access(region_name), name=region_name, type="PubSub", subs_live=1, subs_max=3, problem=None),
        dict(access(garbage), name=garbage, type="not Kickmsg", subs_live=None, subs_max=None, problem="no Kickmsg magic"),
        dict(access(orphan), name=orphan, type="orphan sidecar", subs_live=None, subs_max=None,
             problem=f"ring-owner records of {orphan.removesuffix('.owners')}, which is gone (kickmsg clean removes it)"),
    ]
    text = cli("list", "--prefix", prefix, "--all", "-o", "name,type,subs")
    assert [line.split() for line in text.text.splitlines()] == [
        ["NAME", "TYPE", "SUBS"], [region_name, "PubSub", "1/3"], [garbage, "not", "Kickmsg", "-"],
        [orphan, "orphan", "sidecar", "-"]]
    subscriber.close()


def test_list_counts_objects_it_cannot_read(prefix):
    """An object this process may not read is not a row but counted in a
    footer (text) or on stderr (--json). The command runs as root without
    the capabilities that bypass file permissions."""
    readable, private = f"/{prefix}_a_readable", f"/{prefix}_b_private"
    make(readable)
    make(private)
    os.chown(f"/dev/shm{private}", 65534, 65534)
    os.chmod(f"/dev/shm{private}", 0o600)
    without_override = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    text = subprocess.run(without_override + command_line(["list", "--prefix", prefix, "-o", "name,type"]),
                          capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert (text.returncode, text.stderr) == (0, b"")
    assert text.stdout.decode().splitlines() == [
        "NAME" + " " * (len(readable) - 2) + "TYPE", f"{readable}  PubSub", "1 object could not be read: permission denied"]
    as_json = subprocess.run(without_override + command_line(["list", "--prefix", prefix, "-o", "name", "--json"]),
                             capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    assert as_json.returncode == 0
    assert as_json.stdout.decode().split() == ["[", "{", '"name":', f'"{readable}"', "}", "]"]
    assert as_json.stderr.decode() == "kickmsg list: 1 object could not be read: permission denied\n"


# -- clean of orphan sidecars -----------------------------------------------------------------------


@on_layout4
def test_clean_removes_sidecars_left_by_native_unlink_and_rm(prefix):
    """A sidecar outlives its region when the native unlink_shm or a plain
    rm removes the region: list --all shows it, clean removes it; the
    sidecar of a region that still exists stays."""
    native, ours, kept = f"/{prefix}_native", f"/{prefix}_ours", f"/{prefix}_kept"
    create_in_child("native", native)
    make(ours)
    make(kept)
    for region_name in (native, ours, kept):
        Subscriber(SharedRegion.open(region_name)).close()  # our subscriber records itself in a sidecar
        assert os.path.exists(owners.sidecar_path(region_name))
    assert run_native(UNLINK, name=native) == "ok"
    os.unlink(f"/dev/shm{ours}")
    orphans = [f"{native}.kickmsg-subscribers", f"{ours}.kickmsg-subscribers"]

    listed = cli_json("list", "--prefix", prefix, "--all", "-o", "name,type")
    assert listed == [{"name": kept, "type": "PubSub"}] + [{"name": o, "type": "orphan sidecar"} for o in orphans]
    dry = cli_json("clean", "--prefix", prefix, "--dry-run")
    assert (dry["removed"], dry["sidecars"]) == ([], orphans)
    cleaned = cli_json("clean", "--prefix", prefix)
    assert cleaned["sidecars"] == orphans
    assert not any(exists(o) for o in orphans)
    assert exists(kept) and os.path.exists(owners.sidecar_path(kept))


# -- dead subscribers and geometry hazards: stats, diagnose, audit, repair ------------------------------


@on_layout4
def test_dead_subscriber_in_stats_diagnose_audit_and_repair_sentences(name):
    """A subscriber of ours killed with SIGKILL (ring 0) beside a native one
    (ring 1, no owner record): stats marks it dead, diagnose and audit exit
    1 and name it, repair reclaims it and says so in sentences."""
    make(name)
    with start_ours(HOLD_A_RING, name=name) as dying:
        dying.wait_ready()
        with start_native(HOLD_A_RING, name=name) as native:
            native.wait_ready()
            pid = dying.proc.pid
            os.kill(pid, signal.SIGKILL)
            dying.proc.wait(timeout=10)

            stats = cli("stats", name)
            assert stats.code == 0
            lines = stats.text.splitlines()
            assert lines[2].split()[:2] == ["0", "Live"] and f" {pid} (dead) " in lines[2]
            assert lines[-2] == f"ring 0: its subscriber (pid {pid}) died; kickmsg repair {name} reclaims it"
            assert lines[-1] == "publishers: none recorded (+ unrecorded: native publishers cannot be seen)"

            diagnosis = cli("diagnose", name)
            assert diagnosis.code == 1
            assert ["dead_subscriber_rings", "1"] in [line.split() for line in diagnosis.text.splitlines()]
            assert f"ring 0: its subscriber (pid {pid}) died; kickmsg repair reclaims it" in diagnosis.text.splitlines()

            audited = cli("audit", name)
            assert audited.code == 1
            assert audited.text.splitlines()[0].startswith("DAMAGED: rings held by dead subscribers: 1;")
            assert f"  ring 0 is held by dead subscriber {pid} (kickmsg repair reclaims it)" in audited.text.splitlines()

            repaired = cli("repair", name)
            assert (repaired.code, repaired.err) == (0, b"")
            assert repaired.text.splitlines() == [
                f"reclaimed ring 0 of dead subscriber {pid}",
                f"left ring 1 alone: held by a subscriber that records no owner (native, or one that could not record "
                f"itself); once no process reads it, kickmsg repair {name} --ring 1 --force frees it",
                "repaired 0 locked entries",
            ]
            assert live_rings(name) == [1]
            assert cli("diagnose", name).code == 0
            native.tell()
            assert native.result() == "ok"


def test_native_region_with_a_pool_too_small_is_flagged(name):
    """The native 0.1.0 accepts pool_size <= sub_ring_capacity; info warns,
    diagnose and audit exit 1 and say why, a writing command prints the
    library's warning on one line and goes on."""
    create_in_child("native", name, pool_size=8)  # SMALL's ring holds 8

    info = cli("info", name)
    assert info.code == 0
    warning = [line for line in info.text.splitlines() if line.startswith("warning")]
    assert len(warning) == 1 and warning[0].split(None, 1)[1].startswith(HAZARD)
    assert cli_json("info", name)["hazards"][0].startswith(HAZARD)

    diagnosis = cli_json("diagnose", name, code=1)
    assert (diagnosis["pool_too_small"], diagnosis["healthy"]) == (True, False)
    assert any(line.startswith(f"warning: {HAZARD}") for line in cli("diagnose", name).text.splitlines())

    audited = cli("audit", name)
    assert audited.code == 1
    assert audited.text.splitlines()[0].startswith("DAMAGED: pools too small for their rings: 1;")
    assert audited.text.splitlines()[1].startswith(f"  {HAZARD}")
    assert cli_json("audit", name, code=1)["hazards"][0].startswith(HAZARD)

    published = cli("pub", name, "hello")
    assert published.code == 0
    [line] = published.error_lines
    assert line.startswith(f"kickmsg pub: warning: {name}: {HAZARD}")


# -- create -----------------------------------------------------------------------------------


@on_layout4
def test_create_with_defaults_prints_what_it_made(name):
    """create NAME: Config()'s geometry, a PubSub channel; the printout
    names the geometry, the size and the mode."""
    result = cli("create", name.lstrip("/"))
    assert (result.code, result.err) == (0, b"")
    header = rawregion.header(rawregion.read_bytes(name))
    defaults = Config()
    assert (header["magic"], header["channel_type"]) == (MAGIC, PUBSUB)
    assert (header["max_subs"], header["sub_ring_capacity"], header["pool_size"], header["slot_data_size"]) == (
        defaults.max_subscribers, defaults.sub_ring_capacity, defaults.pool_size, defaults.max_payload_size)
    lines = result.text.splitlines()
    assert lines[0] == f"created {name}"
    fields = dict(line.split(None, 1) for line in lines[1:])
    assert fields == {
        "type": "PubSub", "layout": "4", "max_subscribers": "16", "sub_ring_capacity": "64", "pool_size": "256",
        "max_payload_size": "4096", "commit_timeout_us": str(header["commit_timeout_us"]),
        "total_size": str(header["total_size"]), "mode": access(name)["mode"], "creator": "kickmsg-create",
    }
    assert os.stat(f"/dev/shm{name}").st_size == header["total_size"]


@on_layout4
def test_create_with_options_and_topic_naming(prefix):
    """--topic/--prefix naming, --broadcast (the type), geometry, creator, mode, --json."""
    umask = os.umask(0)
    os.umask(umask)
    made = cli_json("create", "--topic", "chat", "--prefix", prefix, "--broadcast", "--max-subscribers", "4",
                    "--ring", "16", "--pool", "40", "--payload", "128", "--commit-timeout", "0.25",
                    "--creator", "ops", "--mode", "0640")
    name = f"/{prefix}_chat"
    header = rawregion.header(rawregion.read_bytes(name))
    assert made == {
        "name": name, "type": "Broadcast", "layout": 4, "max_subscribers": 4, "sub_ring_capacity": 16, "pool_size": 40,
        "max_payload_size": 128, "commit_timeout_us": 250000, "total_size": header["total_size"],
        "mode": f"{0o640 & ~umask:04o}", "creator": "ops", "replaced": False,
    }
    assert (header["channel_type"], header["max_subs"], header["commit_timeout_us"]) == (BROADCAST, 4, 250000)
    assert os.stat(f"/dev/shm{name}").st_mode & 0o777 == 0o640 & ~umask
    assert cli_json("info", name)["creator_name"] == "ops"


def test_create_refuses_an_existing_name_unless_replace(name):
    """An existing region (or any object) is left untouched, exit 2, and
    the error says --replace would replace it; --replace does."""
    make(name)
    before = snapshot(name)
    assert_one_line_error(cli("create", name), "create", f"{name} already exists (--replace would replace it)")
    assert snapshot(name) == before
    replaced = cli_json("create", name, "--replace", "--ring", "4", "--pool", "5")
    assert (replaced["replaced"], replaced["sub_ring_capacity"], replaced["pool_size"]) == (True, 4, 5)
    assert rawregion.header(rawregion.read_bytes(name))["pool_size"] == 5
    assert cli("create", name, "--replace").text.splitlines()[0] == f"replaced {name}"


@pytest.mark.parametrize("options, phrase", [
    (["--ring", "3"], "sub_ring_capacity must be a power of 2 (got 3)"),
    (["--ring", "8", "--pool", "8"], HAZARD),
    (["--mode", "1777"], "is not a permission mode"),
    (["--commit-timeout", "-1"], "commit_timeout must not be negative"),
    (["--commit-timeout", "1e309"], "commit_timeout must be a finite number of seconds, got inf"),
    (["--commit-timeout", "1e300"], "commit_timeout must be at most 1 day"),
])
@on_layout4
def test_create_with_an_invalid_geometry_is_one_line(name, options, phrase):
    """The library's refusal, on one line, exit 2; nothing is created."""
    assert_one_line_error(cli("create", name, *options), "create", phrase)
    assert not exists(name)


def test_create_mode_must_be_octal(name):
    result = cli("create", name, "--mode", "0968")
    assert result.code == 2
    assert result.error_lines[-1] == ("kickmsg create: error: argument --mode: not an octal permission mode "
                                      "such as 0600 or 0660: '0968' (see kickmsg create --help)")
    assert not exists(name)


# -- rm ----------------------------------------------------------------------------------------


def test_rm_removes_regions_and_sidecars_and_names_what_it_refused(prefix):
    """Each name gets a line: removed (stdout) or the reason (stderr); a
    missing name or a non-Kickmsg object does not stop the others; exit 2."""
    first, second, missing, garbage = (f"/{prefix}_{label}" for label in ("first", "second", "missing", "garbage"))
    make(first)
    Subscriber(make(second)).close()  # leaves a sidecar
    pathlib.Path(f"/dev/shm{garbage}").write_bytes(b"no magic here")
    result = cli("rm", first, missing, garbage, second.lstrip("/"))
    assert result.code == 2
    assert result.text.splitlines() == [f"removed {first}", f"removed {second}"]
    assert result.error_lines == [
        f"kickmsg rm: error: no such region: {missing}",
        f"kickmsg rm: error: not a Kickmsg region: {garbage} (--force removes it anyway)",
    ]
    assert not exists(first) and not exists(second) and not os.path.exists(owners.sidecar_path(second))
    assert exists(garbage)
    forced = cli("rm", garbage, "--force", "--json")
    assert (forced.code, forced.json()) == (0, {"removed": [garbage], "errors": {}, "types": {garbage: None}})
    assert not exists(garbage)


def test_rm_json_lists_errors_by_name(prefix):
    missing = f"/{prefix}_missing"
    result = cli("rm", missing, "--json")
    assert result.code == 2
    assert result.json() == {"removed": [], "errors": {missing: f"no such region: {missing}"}, "types": {}}
    assert result.error_lines == [f"kickmsg rm: error: no such region: {missing}"]


# -- pub --create -------------------------------------------------------------------------------


def test_pub_create_makes_a_missing_channel(prefix):
    """Without --create a missing channel is an error that suggests it; with
    it the channel is created with the geometry options; an existing one is
    used as it is; geometry options need --create."""
    name = f"/{prefix}_cmd"
    assert_one_line_error(cli("pub", name, "hi"), "pub", f"no such region: {name} (pub --create creates it)")
    assert not exists(name)
    created = cli_json("pub", name, "hi", "--create", "--ring", "8", "--pool", "12", "--payload", "32")
    assert created["published"] == 1
    header = rawregion.header(rawregion.read_bytes(name))
    assert (header["sub_ring_capacity"], header["pool_size"], header["slot_data_size"], header["channel_type"]) == (8, 12, 32, PUBSUB)
    assert cli_json("info", name)["creator_name"] == "kickmsg-pub"
    again = cli_json("pub", name, "again", "--create", "--pool", "64")  # exists: used as it is
    assert again["published"] == 1
    assert rawregion.header(rawregion.read_bytes(name))["pool_size"] == 12
    assert_one_line_error(cli("pub", name, "x", "--pool", "64"), "pub", "--pool: only with --create")
    assert_one_line_error(cli("pub", name, "x", "--layout", "9"), "pub", "--layout: only with --create")


@pytest.mark.parametrize("command", ["create", "pub"])
def test_create_and_pub_create_choose_the_layout(prefix, command, monkeypatch):
    """--layout 9 makes a layout-9 region whatever $KICKMSG_LAYOUT says, and
    --layout 4 a layout-4 one; list and info show which; another value is
    refused by the parser."""
    monkeypatch.setenv("KICKMSG_LAYOUT", "4")
    made = {}
    for layout in (9, 4):
        name = f"/{prefix}_l{layout}"
        extra = ["hi", "--create"] if command == "pub" else []
        result = cli_json(command, name, *extra, "--layout", str(layout), "--ring", "8", "--pool", "12", "--payload", "32")
        made[name] = layout
        assert cli_json("info", name)["version"] == layout
        if command == "create":
            assert result["layout"] == layout
    assert {row["name"]: row["version"] for row in cli_json("list", "--prefix", prefix)} == made
    refused = cli(command, f"/{prefix}_l5", *(["hi", "--create"] if command == "pub" else []), "--layout", "5")
    assert refused.code == 2 and b"invalid choice: 5" in refused.err


def test_pub_create_of_a_node_broadcast_channel(prefix):
    """--broadcast CH names a Node broadcast channel: --create makes it a Broadcast one."""
    assert cli_json("pub", "hello", "--broadcast", "chat", "--prefix", prefix, "--create", "--pool", "80")["published"] == 1
    header = rawregion.header(rawregion.read_bytes(f"/{prefix}_broadcast_chat"))
    assert (header["channel_type"], header["pool_size"]) == (BROADCAST, 80)


# -- python -m kickmsg --------------------------------------------------------------------------


def test_python_m_kickmsg_is_the_command(name):
    """python -m kickmsg gives the same output and exit status as kickmsg."""
    make(name)
    for args in (["--version"], ["info", name, "--json"], ["diagnose", name], ["info", f"{name}_missing"], ["echo"]):
        script = subprocess.run(command_line(args), capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        module = subprocess.run([sys.executable, "-m", "kickmsg", *args], capture_output=True, timeout=30,
                                stdin=subprocess.DEVNULL)
        assert module.returncode == script.returncode, args
        assert module.stderr == script.stderr, args
        if args[0] == "info" and script.returncode == 0:  # the region's age moves on between the two
            assert without_age(module.stdout) == without_age(script.stdout)
        else:
            assert module.stdout == script.stdout, args


def without_age(output: bytes) -> dict:
    return {key: value for key, value in json.loads(output).items() if key != "age_s"}
