"""Checks of implementations: crosscheck, verify."""
import argparse
import sys
import time

from kickmsg.cli.common import EXIT_FOUND, EXIT_OK, CommandError, emit

__all__ = ["PROGRESS_INTERVAL_S", "Progress", "cmd_crosscheck", "cmd_verify"]

PROGRESS_INTERVAL_S = 5.0  # a longer exploration says how far it is on stderr, this often


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
    import dataclasses

    from kickmsg import verify

    # Every number given within its documented range, before anything runs
    # (a scenario's numbers that are not options, such as idle, are None here).
    ranges = {**verify.BOUNDS, **verify.SIZES, "rings": (1, verify.SIZES["rings"][1])}
    for option, (least, most) in ranges.items():
        value = getattr(args, option, None)
        if value is not None and not least <= value <= most:
            raise CommandError(f"--{option.replace('_', '-')} must be from {least} to {most}, not {value}")
    if args.layout == 9:
        return _verify_layout9(args)
    if args.mutant in verify.MUTANTS9:
        raise CommandError(f"mutant {args.mutant} breaks layout 9's flows: add --layout 9")
    if args.deaths or args.subscriber_deaths or args.reclaimers:
        raise CommandError("--deaths, --subscriber-deaths and --reclaimers explore layout 9: add --layout 9")
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

    began = time.monotonic()
    table = orders.check_orders(preemptions, stale, budget, progress=lambda row: print(
        f"{row.site.path}:{row.site.line} {row.site.operation} -> {row.weakened}: {row.result}", file=sys.stderr),
        layout=layout)
    bounds = f"at most {preemptions} preemption(s), {stale} stale read(s), {budget} in all"
    emit(args, {"bounds": bounds, "seconds": round(time.monotonic() - began), "rows": [r.to_dict() for r in table]},
         f"{orders.format_table(table)}\n{len(table)} rows in {time.monotonic() - began:.0f} s "
         f"(under ra, {bounds})")
    return EXIT_OK


def _verify_layout9(args: argparse.Namespace) -> int:
    """``kickmsg verify --layout 9``: layout 9's flows, their mutants."""
    import dataclasses

    from kickmsg import verify
    from kickmsg.verify.layout9 import MUTANT_SCENARIOS9

    if args.orders:
        if args.memory_model == "sc":
            raise CommandError("--orders explores under --memory-model ra")
        return _orders(args, 9, args.preemptions if args.preemptions is not None else 0,
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

    def __call__(self, outcome: object) -> None:
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
        else:
            report = verify.explore(scenario, args.mutant, preemptions, max_schedules=args.max_schedules,
                                    memory_model=model, stale=stale, budget=budget,
                                    observe=Progress(args.max_schedules, "at most "))
    except ValueError as error:  # the region cannot be laid out (actors' errors are violations)
        raise CommandError(f"bad scenario: {error}") from None
    data = {
        "mutant": report.mutant, "scenario": dataclasses.asdict(scenario), "schedules": report.schedules,
        "exhaustive": report.complete, "seconds": round(report.seconds, 3), "violation": report.violation,
        "trace": report.trace, "memory_model": model, "preemptions": preemptions, "stale": stale,
        "budget": budget,
    }
    text = report.summary() if report.trace is None else f"{report.trace}\n{report.summary()}"
    emit(args, data, text)
    return EXIT_FOUND if report.violation else EXIT_OK
