"""Checks of implementations: crosscheck, verify."""
import argparse
import sys
import time

from kickmsg.cli.common import EXIT_FOUND, EXIT_OK, CommandError, emit


def cmd_crosscheck(args: argparse.Namespace) -> int:
    from kickmsg import crosscheck

    try:
        if args.replay:
            operations = crosscheck.load_operations(args.replay)
            result = crosscheck.replay(args.other_python, operations, args.other_path)
        else:
            result = crosscheck.crosscheck(args.other_python, args.other_path, ops=args.ops, seed=args.seed)
    except crosscheck.SetupError as error:
        raise CommandError(str(error)) from None
    emit(args, result.to_dict(), result.report())
    return EXIT_OK if result.agreed else EXIT_FOUND


def cmd_verify(args: argparse.Namespace) -> int:
    import dataclasses

    from kickmsg import verify

    for option in ("preemptions", "max_schedules", "runs", "stale", "budget"):
        if (getattr(args, option) or 0) < 0:
            raise CommandError(f"--{option.replace('_', '-')} must be 0 or more, not {getattr(args, option)}")
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
        from kickmsg.verify import orders

        began = time.monotonic()
        table = orders.check_orders(preemptions, stale, budget, progress=lambda row: print(
            f"{row.site.path}:{row.site.line} {row.site.operation} -> {row.weakened}: {row.result}", file=sys.stderr))
        bounds = f"at most {preemptions} preemption(s), {stale} stale read(s), {budget} in all"
        emit(args, {"bounds": bounds, "seconds": round(time.monotonic() - began), "rows": [r.to_dict() for r in table]},
             f"{orders.format_table(table)}\n{len(table)} rows in {time.monotonic() - began:.0f} s "
             f"(under ra, {bounds})")
        return EXIT_OK
    scenario = verify.MUTANT_SCENARIOS.get(args.mutant, verify.Scenario())
    changes = {field: getattr(args, field) for field in ("publishers", "messages", "subscribers", "capacity", "pool")}
    changes["repairer"] = True if args.repair_pass else None
    scenario = dataclasses.replace(scenario, **{k: v for k, v in changes.items() if v is not None})
    try:
        if args.seed is not None:
            report = verify.explore_random(scenario, args.mutant, runs=args.runs, seed=args.seed, memory_model=model,
                                           stale=stale)
        else:
            report = verify.explore(scenario, args.mutant, preemptions, max_schedules=args.max_schedules,
                                    memory_model=model, stale=stale, budget=budget)
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
