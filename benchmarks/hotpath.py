"""Hot-path timings of this package alone, for optimising it.

    python benchmarks/hotpath.py [--tree DIR ...] [--repeats N] [--rounds N] [--fastest] [--only NAME ...]

Times, in one process per source tree (``--tree``: a checkout of this
package with its shim built, e.g. a ``git worktree`` of an older commit;
default: this checkout), and alternating between the trees so that they
share the machine's state:

  pair 64 B        ``send`` + ``try_receive``, default config (16 rings, 1 Live)
  pair view 64 B   ``send`` + ``try_receive_view`` + ``release``
  pair alloc 64 B  ``allocate`` + ``publish`` + ``try_receive``
  send, 1 of 16    ``send`` alone, default config, 1 Live ring that reads
                   (received outside the timing)
  send, N rings    ``send`` alone with N Live rings that never read (every
                   ring wrapped: each publish also evicts), 64 B
  send after sleep ``send`` as in "send, 1 of 16", each after a 1 ms sleep
                   (cold caches: what a latency measurement pays)
  pop + push       one slot off the free stack and back
  shim: NAME       one call of the compiled atomics shim through
                   ``kickmsg.atomics.HARDWARE``, and of the builtin ``abs``
                   for scale (the empty loop's cost subtracted)

Each figure is the median over repeats of the mean ns per operation
(``--fastest``: the fastest repeat and round instead, steadier on a machine
that other jobs keep busy; "send, 1 of 16" and "send after sleep" stay
medians of single sends). After each flow's figure, in brackets: the calls
into the atomics shim it makes per operation (the region's atomics swapped
for a counting copy, averaged over 1 000 operations after the timing). Not
part of ``make bench``: that one compares against the peers.

The channels are layout 4's (the free-stack and shim rows know its
internals) unless ``KICKMSG_LAYOUT`` says otherwise:
``KICKMSG_LAYOUT=9 python benchmarks/hotpath.py --only send`` times layout
9's sends.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OPERATIONS = 20_000  # per repeat
COUNTED_OPERATIONS = 1_000  # per count of shim calls


def measure(repeats: int, fastest: bool, only: list[str]) -> dict:
    """Run in a child process whose sys.path starts at one tree."""
    import kickmsg
    from kickmsg.protocol.v4 import layout
    from kickmsg.protocol import freestack
    from kickmsg import atomics
    from kickmsg.atomics import HARDWARE

    class CountingAtomics(atomics.Atomics):
        """The hardware atomics, counting the calls made through them."""

        def __init__(self):
            self.calls = 0

    def counted_operation(name):
        def counted(self, *arguments):
            self.calls += 1
            return getattr(HARDWARE, name)(*arguments)

        return counted

    for name in [name for name in vars(atomics.Atomics) if not name.startswith("_")]:  # the door's operations
        setattr(CountingAtomics, name, counted_operation(name))

    calls = {}  # figure name -> shim calls per operation

    def timed(operation) -> float:
        spans = []
        for _ in range(repeats):
            start = time.perf_counter_ns()
            for _ in range(OPERATIONS):
                operation()
            spans.append((time.perf_counter_ns() - start) / OPERATIONS)
        return round(min(spans) if fastest else statistics.median(spans))

    def core_of(region):
        """The region's core (in a tree before issue 35, a layout-4 SharedRegion was its own core)."""
        return getattr(region, "core", region)

    def counted(figure: str, region, operation, between=None) -> None:
        """Note the shim calls per ``operation`` on ``region`` as ``figure``'s
        (``between``, if given, runs uncounted after each)."""
        counting = CountingAtomics()
        for _ in range(COUNTED_OPERATIONS):
            core_of(region).atomics = counting
            try:
                operation()
            finally:
                core_of(region).atomics = HARDWARE
            if between:
                between()
        calls[figure] = counting.calls / COUNTED_OPERATIONS

    def on_region(max_subscribers: int, live_rings: int, body) -> float:
        name = f"/km_hotpath_{os.getpid()}"
        region = kickmsg.SharedRegion.create(name, kickmsg.ChannelType.PubSub, kickmsg.Config(max_subscribers=max_subscribers), "hotpath")
        try:
            subscribers = [kickmsg.Subscriber(region) for _ in range(live_rings)]
            result = body(region, kickmsg.Publisher(region), subscribers)
            for subscriber in subscribers:
                subscriber.close()
            return result
        finally:
            kickmsg.unlink_shm(name)

    payload = bytes(64)

    def pair(region, publisher, subscribers):
        send, receive = publisher.send, subscribers[0].try_receive
        timed(lambda: (send(payload), receive()))  # warm up: every ring entry used once
        result = timed(lambda: (send(payload), receive()))
        counted("pair 64 B", region, lambda: (send(payload), receive()))
        return result

    def pair_view(region, publisher, subscribers):
        send, receive = publisher.send, subscribers[0].try_receive_view
        result = timed(lambda: (send(payload), receive().release()))
        counted("pair view 64 B", region, lambda: (send(payload), receive().release()))
        return result

    def pair_allocate(region, publisher, subscribers):
        allocate, receive = publisher.allocate, subscribers[0].try_receive
        result = timed(lambda: (allocate(64).publish(), receive()))
        counted("pair alloc 64 B", region, lambda: (allocate(64).publish(), receive()))
        return result

    def send_only(figure: str, region, publisher, subscribers):
        send = publisher.send
        timed(lambda: send(payload))
        result = timed(lambda: send(payload))
        counted(figure, region, lambda: send(payload))
        return result

    def send_one_of_16(figure: str, region, publisher, subscribers, pause_s=0.0):
        send, receive = publisher.send, subscribers[0].try_receive
        spans = []
        for _ in range(OPERATIONS // 10 if pause_s else OPERATIONS):
            if pause_s:
                time.sleep(pause_s)
            start = time.perf_counter_ns()
            send(payload)
            spans.append(time.perf_counter_ns() - start)
            receive()
        counted(figure, region, lambda: send(payload), between=receive)
        return statistics.median(spans)

    def pop_push(region, publisher, subscribers):
        core = core_of(region)
        result = timed(lambda: freestack.push(core, freestack.pop(core, empty_on_corrupt_head=False)))
        counted("pop + push", region, lambda: freestack.push(core, freestack.pop(core, empty_on_corrupt_head=False)))
        return result

    def shim_calls(region, publisher, subscribers):
        # Loads and a CAS that changes nothing on free_top; stores of 0 into
        # the refcount of a free slot (already 0).
        ops, word = core_of(region).atomics, core_of(region).free_top_address
        refcount = core_of(region).slot_address(0) + layout.REFCOUNT_OFFSET
        top = ops.load_relaxed_u64(word)
        empty = timed(lambda: None)
        return {
            "shim: load_relaxed_u32": timed(lambda: ops.load_relaxed_u32(word)) - empty,
            "shim: store_relaxed_u32": timed(lambda: ops.store_relaxed_u32(refcount, 0)) - empty,
            "shim: cas_acq_rel_u64": timed(lambda: ops.cas_acq_rel_u64(word, top, top)) - empty,
            "builtin abs()": timed(lambda: abs(word)) - empty,
        }

    figures = {  # name -> (rings, Live rings, body)
        "pair 64 B": (16, 1, pair),
        "pair view 64 B": (16, 1, pair_view),
        "pair alloc 64 B": (16, 1, pair_allocate),
        "send, 1 of 16": (16, 1, lambda *args: send_one_of_16("send, 1 of 16", *args)),
        **{
            f"send, {rings} rings": (rings, rings, lambda *args, figure=f"send, {rings} rings": send_only(figure, *args))
            for rings in (1, 4, 16)
        },
        "send after sleep": (16, 1, lambda *args: send_one_of_16("send after sleep", *args, pause_s=0.001)),
        "pop + push": (1, 0, pop_push),
    }
    results = {
        name: on_region(*figure) for name, figure in figures.items() if not only or any(part in name for part in only)
    }
    if not only or any(part in "shim: builtin abs()" for part in only):
        results.update(on_region(1, 0, shim_calls))
    return {"ns": results, "calls": calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", type=pathlib.Path, help="a source tree to time (repeatable)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per figure (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the trees, medians taken (default 3)")
    parser.add_argument("--only", action="append", default=[], help="time only the figures whose name contains this (repeatable)")
    parser.add_argument("--fastest", action="store_true", help="the fastest repeat and round, not the medians")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        sys.path.insert(0, arguments.child)
        print(json.dumps(measure(arguments.repeats, arguments.fastest, arguments.only)))
        return 0
    trees = [tree.resolve() for tree in arguments.tree or [ROOT]]
    runs = {tree: [] for tree in trees}
    for _ in range(arguments.rounds):
        for tree in trees:
            command = [sys.executable, "-P", __file__, "--child", str(tree), "--repeats", str(arguments.repeats)]
            command += ["--fastest"] if arguments.fastest else []
            command += [option for part in arguments.only for option in ("--only", part)]
            layout = {"KICKMSG_LAYOUT": os.environ.get("KICKMSG_LAYOUT", "4")}
            child = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, **layout})
            if child.returncode:
                sys.exit(f"hotpath: timing {tree} failed:\n{child.stderr}")
            runs[tree].append(json.loads(child.stdout))
    names = list(runs[trees[0]][0]["ns"])
    summary = min if arguments.fastest else statistics.median
    print("ns per operation,", "fastest" if arguments.fastest else "median", "of", arguments.rounds,
          "rounds [shim calls per operation];", " | ".join(str(tree) for tree in trees))
    for name in names:
        figures = [summary(run["ns"][name] for run in runs[tree]) for tree in trees]
        calls = [runs[tree][0]["calls"].get(name) for tree in trees]
        columns = "".join(f"{figure:>10.0f}" + (f" [{count:4.1f}]" if count is not None else " " * 7) for figure, count in zip(figures, calls))
        ratios = "" if len(trees) == 1 else "  (" + ", ".join(f"{figure / figures[0]:.2f}x" for figure in figures[1:]) + " of the first)"
        print((f"  {name:<24}" + columns + ratios).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
