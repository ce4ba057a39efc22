"""Checks of implementations: crosscheck, verify."""
import argparse
import signal
import sys
import time
from types import FrameType

from kickmsg.cli.common import EXIT_FOUND, EXIT_OK, CommandError, Commands, add_command, emit
from kickmsg.stopsignals import EXIT_FORCED

__all__ = ["PROGRESS_INTERVAL_S", "Progress", "RowProgress", "add_commands", "cmd_crosscheck", "cmd_verify"]

PROGRESS_INTERVAL_S = 5.0  # a longer exploration says how far it is on stderr, this often
_counting: list["Progress | RowProgress"] = []  # the counts of the verify running: an interrupted one's last line
_ctrl_c: list[int] = []  # the SIGINTs the verify running was sent


def _on_ctrl_c(number: int, frame: FrameType | None) -> None:
    """SIGINT while verify runs: KeyboardInterrupt now, unless a finalizer
    runs (Python prints and ignores what ``__del__`` raises: a dead
    actor's Subscriber is left to the collector); then at the next
    schedule or row counted (``_stop_if_interrupted``)."""
    _ctrl_c.append(number)
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def _stop_if_interrupted() -> None:
    if _ctrl_c:
        raise KeyboardInterrupt


def add_commands(commands: Commands) -> None:
    """crosscheck, verify: their options and examples."""
    sub = add_command(commands, "crosscheck", cmd_crosscheck,
                      "run random operations on this package and another implementation, compare results and region "
                      "bytes (exit 1 at the first divergence, printing a sequence that reproduces it)",
                      "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.1.0\n"
                      "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.9.2 --layout 9\n"
                      "  kickmsg crosscheck --other-python /opt/py/bin/python --ops 5000 --seed 7 --json\n"
                      "  kickmsg crosscheck --other-python python3 --other-path .native/kickmsg-0.1.0 --replay repro.jsonl",
                      channel=False)
    sub.add_argument("--other-python", required=True, metavar="PY", help="interpreter of the other implementation")
    sub.add_argument("--other-path", metavar="DIR", help="put DIR (or DIR:DIR...) first on its sys.path, run it with "
                     "-I -S (default: -I and its own kickmsg)")
    sub.add_argument("--ops", type=int, default=1000, help="number of random operations (default 1000; 1 to 1000000)")
    sub.add_argument("--seed", type=int, default=0, help="seed of the random sequence (default 0)")
    sub.add_argument("--replay", metavar="FILE", help="run the operations in FILE (one JSON list per line) instead")
    sub.add_argument("--layout", type=int, choices=(4, 9), default=4,
                     help="channel layout compared: 4 (native 0.1.0's API, the default) or 9 (native 0.9.2's)")

    sub = add_command(commands, "verify", cmd_verify,
                      "run the package's publish, receive, join and leave code under a controlled scheduler, checking "
                      "the protocol's invariants after every atomic step (exit 1 at a violation, printing the trace)",
                      "  kickmsg verify                                  # every schedule with <= 2 preemptions\n"
                      "  kickmsg verify --mutant release-before-lock     # break a rule of the spec: a trace is printed\n"
                      "  kickmsg verify --seed 7 --runs 5000             # seeded random schedules instead\n"
                      "  kickmsg verify --publishers 3 --capacity 4 --preemptions 1\n"
                      "  kickmsg verify --repair-pass --preemptions 1        # a repair pass racing live traffic\n"
                      "  kickmsg verify --memory-model ra                # C11 release/acquire: <= 2 preemptions + stale reads\n"
                      "  kickmsg verify --mutant spec-seqlock-orders     # the spec's seqlock orders: a stale re-check (ra)\n"
                      "  kickmsg verify --mutant commit-relaxed          # a memory-order mutant (explored under ra)\n"
                      "  kickmsg verify --orders                         # weaken each order one step: which are needed?\n"
                      "  kickmsg verify --mutations --layout 9           # mutants of the flows' source: which survive?\n"
                      "  kickmsg verify --layout 9                       # layout 9 (0.9.2): stalls, steals, <= 1 preemption\n"
                      "  kickmsg verify --layout 9 --deaths 1 --blocking # a publisher may die; subscribers sleep on the futex\n"
                      "  kickmsg verify --layout 9 --repair-pass --publishers 1 --preemptions 2   # repair_locked_entries racing\n"
                      "  kickmsg verify --layout 9 --subscriber-deaths 1 --reclaimers 1   # reclaim_dead_rings racing\n"
                      "  kickmsg verify --layout 9 --crash-points        # an actor dies at each step of each flow in turn\n"
                      "  kickmsg verify --layout 9 --mutant no-meta-tag-check   # 0.9's receive: the bug 0.9.2 fixed (ra)",
                      channel=False)
    from kickmsg.verify import BOUNDS, SIZES
    from kickmsg.verify.crashes import FLOWS as CRASH_FLOWS
    from kickmsg.verify.mutants import MUTANTS, MUTANTS9

    def within(name: str) -> str:  # the range a number is refused beyond
        least, most = {**SIZES, **BOUNDS}[name]
        return f"{least} to {most}"

    sub.add_argument("--layout", type=int, choices=(4, 9), default=4,
                     help="the flows explored: layout 4 (kickmsg 0.1.0, default) or layout 9 (kickmsg.protocol.v9)")
    sub.add_argument("--mutant", choices=sorted({**MUTANTS, **MUTANTS9}),
                     help="break one rule of the spec (default: none; layout 9's mutants need --layout 9)")
    sub.add_argument("--preemptions", type=int, metavar="K",
                     help="explore every schedule with at most K preemptions (default 2; 1 with --orders or "
                          f"--layout 9, or the mutant's; {within('preemptions')})")
    sub.add_argument("--memory-model", choices=("sc", "ra"),
                     help="sc: sequential consistency; ra: the C11 release/acquire/relaxed model, with data races "
                          "on payloads (default: sc, or ra for a memory-order mutant)")
    sub.add_argument("--stale", type=int, metavar="W",
                     help="under ra, at most W loads per schedule read an older store than the newest (default 2; "
                          f"{within('stale')})")
    sub.add_argument("--budget", type=int, metavar="B",
                     help="at most B preemptions and stale reads together (default: 2 under ra, no limit under sc; "
                          f"{within('budget')})")
    sub.add_argument("--reduction", choices=("none", "por", "both"), default="por",
                     help="none: every schedule within the bounds; por: one per order of the dependent steps "
                          "(partial-order reduction, default); both: none then por, with the reduction factor")
    sub.add_argument("--orders", action="store_true",
                     help="weaken every memory order of the flows one step in turn and explore under ra (at most "
                          "1 preemption); print which orders a counter-example shows necessary")
    sub.add_argument("--mutations", action="store_true",
                     help="derive mutants from the flows' source (conditions dropped or negated, bounds moved, orders "
                          "weakened, steps removed or swapped), explore each over the layout's scenario set, print "
                          "which survive (default bounds: no preemption, under ra 1 stale read)")
    sub.add_argument("--max-schedules", type=int, default=1_000_000, metavar="N",
                     help=f"stop an exhaustive exploration after N schedules (default 1000000; {within('max_schedules')})")
    sub.add_argument("--seed", type=int, help="run seeded random schedules instead of the exhaustive exploration")
    sub.add_argument("--runs", type=int, default=1000,
                     help=f"random schedules to run with --seed (default 1000; {within('runs')})")
    for field, meaning in (("publishers", "publishers"), ("messages", "messages per publisher"),
                          ("subscribers", "subscribers (each with its own ring)"), ("capacity", "ring capacity"),
                          ("pool", "pool slots")):
        sub.add_argument(f"--{field}", type=int, metavar="N",
                         help=f"{meaning} (default: the mutant's scenario; {within(field)})")
    sub.add_argument("--rings", type=int, metavar="N",
                     help="max_subscribers (default: one per subscriber; with fewer, a subscriber retries its join "
                          f"on layout 9; 1 to {SIZES['rings'][1]})")
    sub.add_argument("--repair-pass", action="store_true",
                     help="add an actor that runs repair_locked_entries() once, concurrently")
    sub.add_argument("--deaths", type=int, metavar="N",
                     help="layout 9: at most N publishers die, each at any step (default 0; at most the publishers)")
    sub.add_argument("--subscriber-deaths", type=int, metavar="N",
                     help="layout 9: at most N subscribers die, each at any step (default 0; at most the subscribers)")
    sub.add_argument("--reclaimers", type=int, metavar="N",
                     help="layout 9: add N actors that each run reclaim_dead_rings() once, concurrently (default 0; "
                          f"{within('reclaimers')})")
    sub.add_argument("--blocking", action="store_true",
                     help="subscribers receive with the core's blocking receive, asleep on the futex, instead of polling")
    sub.add_argument("--crash-points", action="store_true",
                     help="layout 9: in each flow (publish, join, receive, leave, a join that heals), make the actor "
                          "die at each step of its default schedule in turn, with traffic and repairs racing, and "
                          "--preemptions K more after each death (default 0); print what each death lost, and any "
                          "violation")
    sub.add_argument("--crash-flow", choices=[flow.key for flow in CRASH_FLOWS],
                     help="with --crash-points, only this flow (default: every one)")


def cmd_crosscheck(args: argparse.Namespace) -> int:
    from kickmsg.verify import crosscheck

    try:
        if args.replay:
            operations = crosscheck.load_operations(args.replay)
            result = crosscheck.replay(args.other_python, operations, args.other_path, layout=args.layout)
        else:
            result = crosscheck.crosscheck(args.other_python, args.other_path, ops=args.ops, seed=args.seed,
                                           layout=args.layout)
    except crosscheck.SetupError as error:
        raise CommandError(str(error)) from None
    emit(args, result.to_dict(), result.report())
    return EXIT_OK if result.agreed else EXIT_FOUND


def cmd_verify(args: argparse.Namespace) -> int:
    """``kickmsg verify``; Ctrl-C ends it with one line on stderr: how far it got."""
    _counting.clear()
    _ctrl_c.clear()
    began = time.monotonic()
    caller = signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        return _verify(args)
    except KeyboardInterrupt:
        done = _counting[-1].counted() if _counting else "nothing run yet"
        print(f"kickmsg verify: interrupted after {time.monotonic() - began:.0f} s: {done} (not exhaustive)",
              file=sys.stderr, flush=True)
        return EXIT_FORCED
    finally:
        signal.signal(signal.SIGINT, caller)


def _verify(args: argparse.Namespace) -> int:
    import dataclasses

    from kickmsg import verify

    # Every number given within its documented range, before anything runs
    # (a scenario's numbers that are not options, such as idle, are None here).
    ranges = {**verify.BOUNDS, **verify.SIZES, "rings": (1, verify.SIZES["rings"][1])}
    for option, (least, most) in ranges.items():
        value = getattr(args, option, None)
        if value is not None and not least <= value <= most:
            raise CommandError(f"--{option.replace('_', '-')} must be from {least} to {most}, not {value}")
    if args.mutations:
        return _mutations(args)
    if args.crash_flow and not args.crash_points:
        raise CommandError("--crash-flow chooses a flow of --crash-points: add --crash-points --layout 9")
    if args.layout == 9:
        return _verify_layout9(args)
    if args.mutant in verify.MUTANTS9:
        raise CommandError(f"mutant {args.mutant} breaks layout 9's flows: add --layout 9")
    if args.deaths or args.subscriber_deaths or args.reclaimers or args.crash_points:
        raise CommandError("--deaths, --subscriber-deaths, --reclaimers and --crash-points explore layout 9: add "
                           "--layout 9")
    preemptions = args.preemptions if args.preemptions is not None else (1 if args.orders else 2)
    mutant = verify.MUTANTS.get(args.mutant)
    model = args.memory_model or ("ra" if args.orders else mutant.model if mutant else "sc")  # memory orders: ra
    if args.orders and model != "ra":
        raise CommandError("--orders explores under --memory-model ra")
    if model == "sc" and args.stale:
        raise CommandError("--stale needs --memory-model ra")
    stale = args.stale if args.stale is not None else (2 if model == "ra" else 0)
    budget = args.budget if args.budget is not None else (2 if model == "ra" else None)
    if args.orders:
        return _orders(args, 4, preemptions, stale, budget)
    scenario = verify.MUTANT_SCENARIOS.get(args.mutant, verify.Scenario())
    changes = {field: getattr(args, field) for field in ("publishers", "messages", "subscribers", "capacity", "pool",
                                                         "rings")}
    changes["repairer"] = True if args.repair_pass else None
    changes["blocking"] = True if args.blocking else None
    scenario = dataclasses.replace(scenario, **{k: v for k, v in changes.items() if v is not None})
    return _explore(args, scenario, model, preemptions, stale, budget)


def _orders(args: argparse.Namespace, layout: int, preemptions: int, stale: int, budget: int | None) -> int:
    """``kickmsg verify --orders``: weaken each order of layout 4's or 9's flows."""
    from kickmsg.verify import orders

    if args.reduction == "both":
        raise CommandError("--orders explores with one reduction: --reduction none or por")
    began = time.monotonic()
    sites = orders.sites() if layout == 4 else orders.sites(orders.FLOWS9)
    progress = RowProgress("sites", every_row=True)
    table = orders.check_orders(preemptions, stale, budget, progress=lambda row: progress(
        sites.index(row.site) + 1, len(sites), f"{row.site.path}:{row.site.line} {row.site.operation} -> "
        f"{row.weakened}: {row.result}"), layout=layout, reduction=args.reduction)
    bounds = (f"at most {preemptions} preemption(s), {stale} stale read(s), {budget} in all, "
              f"reduction {args.reduction}")
    emit(args, {"bounds": bounds, "seconds": round(time.monotonic() - began), "rows": [r.to_dict() for r in table]},
         f"{orders.format_table(table)}\n{len(table)} rows in {time.monotonic() - began:.0f} s "
         f"(under ra, {bounds})")
    return EXIT_OK


MUTATIONS_FIXED = ("mutant", "orders", "seed", "publishers", "messages", "subscribers", "capacity", "pool", "rings",
                   "repair_pass", "deaths", "subscriber_deaths", "reclaimers", "blocking", "memory_model")


def _mutations(args: argparse.Namespace) -> int:
    """``kickmsg verify --mutations``: mutants of layout 4's or 9's flows."""
    from kickmsg.verify import mutations

    given = [f"--{name.replace('_', '-')}" for name in MUTATIONS_FIXED if getattr(args, name) not in (None, False)]
    if given:
        raise CommandError(f"--mutations explores its own scenario set, each under the model its mutants need: "
                           f"drop {', '.join(given)}")
    preemptions = args.preemptions if args.preemptions is not None else 0
    stale = args.stale if args.stale is not None else 1
    began = time.monotonic()
    total = len(mutations.derive(args.layout)[0])
    row_progress = RowProgress("mutants")
    row_progress(0, total)  # an interrupt in the baselines says "0 of N"
    killed: list[bool] = []

    def progress(result: mutations.Result) -> None:
        killed.append(result.killed)
        row_progress(len(killed), total, f"{sum(killed)} killed")

    analysis = mutations.run(args.layout, preemptions, stale, args.budget, args.max_schedules, progress)
    bounds = (f"layout {args.layout}, at most {preemptions} preemption(s), under ra {stale} stale read(s)"
              + ("" if args.budget is None else f", {args.budget} in all"))
    left_out = "".join(f"\nleft out (the unmutated flows fail it): {scenario}" for scenario in analysis.left_out)
    emit(args, {"bounds": bounds, "seconds": round(time.monotonic() - began), **analysis.to_dict()},
         f"{mutations.format_table(analysis.results)}\n{analysis.summary()} in {time.monotonic() - began:.0f} s "
         f"({bounds}){left_out}")
    return EXIT_OK


def _verify_layout9(args: argparse.Namespace) -> int:
    """``kickmsg verify --layout 9``: layout 9's flows, their mutants."""
    import dataclasses

    from kickmsg import verify
    from kickmsg.verify.layout9 import MUTANT_SCENARIOS9

    if args.crash_points:
        return _crash_points(args)
    if args.orders:
        if args.memory_model == "sc":
            raise CommandError("--orders explores under --memory-model ra")
        return _orders(args, 9, args.preemptions if args.preemptions is not None else 1,
                       args.stale if args.stale is not None else 2, args.budget if args.budget is not None else 2)
    if args.mutant is not None and args.mutant not in verify.MUTANTS9:
        raise CommandError(f"mutant {args.mutant} breaks layout 4's flows: choose one of {', '.join(verify.MUTANTS9)}")
    scenario, preemptions, stale = MUTANT_SCENARIOS9.get(args.mutant, (verify.Scenario9(), 1, 1))
    mutant = verify.MUTANTS9.get(args.mutant)
    model = args.memory_model or (mutant.model if mutant else "sc")
    if model == "sc" and args.stale:
        raise CommandError("--stale needs --memory-model ra")
    preemptions = args.preemptions if args.preemptions is not None else preemptions
    stale = (args.stale if args.stale is not None else stale) if model == "ra" else 0
    budget = args.budget
    changes = {field: getattr(args, field) for field in ("publishers", "messages", "subscribers", "capacity", "pool",
                                                         "deaths", "subscriber_deaths", "reclaimers", "rings")}
    changes["blocking"] = True if args.blocking else None
    changes["repairer"] = True if args.repair_pass else None
    if args.publishers is not None or args.messages is not None:
        changes["sends"] = ()  # the counts given replace the mutant scenario's own
    scenario = dataclasses.replace(scenario, **{k: v for k, v in changes.items() if v is not None})
    return _explore(args, scenario, model, preemptions, stale, budget)


class Progress:
    """Counts the schedules an exploration runs and, once it has run for
    PROGRESS_INTERVAL_S, says on stderr how far it is and how fast it goes,
    every PROGRESS_INTERVAL_S again (stdout keeps only the result)."""

    def __init__(self, most: int, bound: str = ""):
        self.most, self.bound = most, bound  # "at most ": the exploration may end before
        self.schedules = 0
        self.began = time.monotonic()
        self.next_line = self.began + PROGRESS_INTERVAL_S
        _counting.append(self)

    def counted(self) -> str:
        return f"{self.schedules} of {self.bound}{self.most} schedules run"

    def __call__(self, outcome: object) -> None:
        _stop_if_interrupted()
        self.schedules += 1
        now = time.monotonic()
        if now >= self.next_line:
            self.next_line = now + PROGRESS_INTERVAL_S
            rate = self.schedules / max(now - self.began, 1e-9)
            print(f"kickmsg verify: {self.schedules} of {self.bound}{self.most} schedules run in {now - self.began:.0f} s "
                  f"({rate:.0f} a second)", file=sys.stderr, flush=True)


def _explore(args: argparse.Namespace, scenario: object, model: str, preemptions: int, stale: int,
             budget: int | None) -> int:
    import dataclasses

    from kickmsg import verify

    assert isinstance(scenario, (verify.Scenario, verify.Scenario9))
    try:
        if args.seed is not None:
            report = verify.explore_random(scenario, args.mutant, runs=args.runs, seed=args.seed, memory_model=model,
                                           stale=stale, observe=Progress(args.runs))
            compared = None
        else:
            reports = [verify.explore(scenario, args.mutant, preemptions, max_schedules=args.max_schedules,
                                      memory_model=model, stale=stale, budget=budget,
                                      observe=Progress(args.max_schedules, "at most "), reduction=reduction)
                       for reduction in (("none", "por") if args.reduction == "both" else (args.reduction,))]
            report, compared = reports[-1], (reports[0] if len(reports) == 2 else None)
    except ValueError as error:  # the region cannot be laid out (actors' errors are violations)
        raise CommandError(f"bad scenario: {error}") from None
    data = {
        "mutant": report.mutant, "scenario": dataclasses.asdict(scenario), "schedules": report.schedules,
        "exhaustive": report.complete, "seconds": round(report.seconds, 3), "violation": report.violation,
        "trace": report.trace, "memory_model": model, "preemptions": preemptions, "stale": stale,
        "budget": budget, "reduction": report.reduction, "schedules_per_second": round(report.rate, 1),
    }
    text = report.summary() if report.trace is None else f"{report.trace}\n{report.summary()}"
    if compared is not None:
        same = (compared.violation is None) == (report.violation is None)
        factor = compared.schedules / max(report.schedules, 1)
        data["none"] = {"schedules": compared.schedules, "seconds": round(compared.seconds, 3),
                        "violation": compared.violation, "exhaustive": compared.complete}
        data["reduction_factor"] = round(factor, 2)
        data["verdicts_agree"] = same
        text = (f"{compared.summary()}\n{text}\nreduction factor {factor:.1f}x ({compared.schedules} schedules "
                f"without, {report.schedules} with); verdicts {'agree' if same else 'DIFFER'}")
    emit(args, data, text)
    return EXIT_FOUND if report.violation else EXIT_OK


class RowProgress:
    """Counts the rows of a table (``--orders``, ``--crash-points``) and
    says on stderr how many are done of how many, in how long, and about
    how long the rest takes: at each row (``every_row``, with the row's
    own line) or every PROGRESS_INTERVAL_S."""

    def __init__(self, unit: str, every_row: bool = False):
        self.unit, self.every_row = unit, every_row
        self.done = self.total = 0
        self.began = time.monotonic()
        self.next_line = self.began + PROGRESS_INTERVAL_S
        _counting.append(self)

    def counted(self) -> str:
        return f"{self.done} of {self.total} {self.unit} done"

    def __call__(self, done: int, total: int, line: str = "") -> None:
        _stop_if_interrupted()
        self.done, self.total = done, total
        now = time.monotonic()
        if not self.every_row and now < self.next_line:
            return
        self.next_line = now + PROGRESS_INTERVAL_S
        elapsed = now - self.began
        left = elapsed / done * (self.total - done) if done else 0.0
        print(f"kickmsg verify: {self.counted()} in {elapsed:.0f} s, about {left:.0f} s left" + (f": {line}" if line
              else ""), file=sys.stderr, flush=True)


def _crash_points(args: argparse.Namespace) -> int:
    """``kickmsg verify --layout 9 --crash-points``: an actor dies at each
    step of each flow of ``kickmsg.verify.crashes.FLOWS``."""
    from kickmsg.verify import crashes

    from kickmsg.verify.mutants import MUTANTS9

    given = [option for option in ("memory_model", "stale", "budget", "seed", "publishers", "messages", "subscribers",
                                   "capacity", "pool", "rings", "deaths", "subscriber_deaths", "reclaimers")
             if getattr(args, option) is not None]
    given += [option for option in ("orders", "repair_pass", "blocking") if getattr(args, option)]
    if given:
        raise CommandError(f"--crash-points runs its own flows under sequential consistency: drop "
                           f"--{given[0].replace('_', '-')}")
    if args.mutant is not None and args.mutant not in MUTANTS9:
        raise CommandError(f"mutant {args.mutant} breaks layout 4's flows: choose one of {', '.join(MUTANTS9)}")
    preemptions = args.preemptions or 0
    began = time.monotonic()
    progress = RowProgress("crash points")
    flows = tuple(flow for flow in crashes.FLOWS if args.crash_flow in (None, flow.key))
    rows = crashes.crash_points(flows, preemptions=preemptions, mutant=args.mutant,
                                progress=lambda row, done, total: progress(done, total))
    failed = [row for row in rows if row.violation is not None]
    seconds = time.monotonic() - began
    bounds = f"at most {preemptions} preemption(s) after each death" + (f", mutant {args.mutant}" if args.mutant else "")
    emit(args, {"preemptions": preemptions, "mutant": args.mutant, "seconds": round(seconds, 3),
                "rows": [row.to_dict() for row in rows]},
         f"{crashes.format_table(rows)}\n{len(rows)} deaths, {sum(row.schedules for row in rows)} schedules in "
         f"{seconds:.1f} s ({bounds}), {len(failed)} with a violation")
    return EXIT_FOUND if failed else EXIT_OK
