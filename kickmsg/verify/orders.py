"""Which memory orders the flows need (``kickmsg verify --orders``).

Every call of the atomics door in the publish, receive, join, leave/drain,
free-stack and repair flows (layout 4's ``FLOWS``; layout 9's ``FLOWS9``,
``kickmsg verify --orders --layout 9``) names its memory order. Each order
in turn is weakened one step (release and acquire to relaxed, acq_rel to
release and to acquire, seq_cst to acq_rel, which for a store is release)
by a mutant that edits that one call, and the flows are explored under
the ra model. A
counter-example shows the order necessary; none within the bounds means a
weaker order would do there, in this scenario and these bounds.

Where the code's order is stronger than the spec's (the sites the mutant
``spec-seqlock-orders`` gives back, docs/explanation/verification.md: "a seqlock
re-check that reads the past"), the table says so; weakened one step, such an order is the
spec's.
"""
import ast
import inspect
import pathlib
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from kickmsg import publisher
from kickmsg.protocol import freestack
from kickmsg.protocol.v4 import publish as publish4
from kickmsg.protocol.v4 import receive as receive4
from kickmsg.protocol.v4 import repair as repair4
from kickmsg.protocol.v4 import rings as rings4
from kickmsg.protocol.v9 import publish as publish9
from kickmsg.protocol.v9 import receive as receive9
from kickmsg.protocol.v9 import repair as repair9
from kickmsg.verify import Report, Scenario, Scenario9, explore
from kickmsg.verify.scheduler import Outcome
from kickmsg.verify.memory import OPERATIONS
from kickmsg.verify.mutants import MUTANTS, Edit, Mutant, Patch

__all__ = [
    "FLOWS", "FLOWS9", "ONE_STEP_WEAKER", "OPERATIONS", "PACKAGE_ROOT", "PREEMPTIONS9", "Row", "SCENARIO9",
    "SCENARIOS", "SCENARIOS9", "SPEC_ORDERS", "Site", "check_orders", "format_table", "sites", "spec_order",
    "weakening",
]

# (flow, owner, function): every function of the flows that calls the door.
FLOWS = (
    ("publish", publish4.Publisher, "_deliver"),
    ("publish", publish4, "wait_and_capture_slot"),
    ("receive", receive4, "pin_next"),
    ("join", rings4, "join"),
    ("leave/drain", rings4, "leave"),
    ("leave/drain", rings4, "set_state"),
    ("leave/drain", rings4, "drain"),
    ("free stack", freestack, "pop"),
    ("free stack", freestack, "push"),
    ("free stack", freestack, "release_slot"),
    ("repair", repair4, "live_window"),
    ("repair", repair4, "repair_locked_entries"),
)
SCENARIOS = {"repair": Scenario(repairer=True)}  # the flows' scenario, if not the default one

# Layout 9's flows (``kickmsg verify --orders --layout 9``). Its repairs run
# once every actor is over (not explored); its seq_cst fences are not calls
# of one order (their mutants no-publisher-fence and no-subscriber-fence).
FLOWS9 = (
    ("publish", publish9.Publisher, "publish"),
    ("publish", publish9.Publisher, "_wait_for_commit"),
    ("publish", publish9.Publisher, "_abandon"),
    ("steal", publish9.Publisher, "_self_repair"),
    ("steal", publish9, "steal_and_skip"),
    ("wake", publish9, "wake_ring"),
    ("receive", receive9.Subscriber, "pin_next"),
    ("receive", receive9.Subscriber, "lose"),
    ("blocking receive", receive9.Subscriber, "park"),
    ("join", receive9.Subscriber, "_try_join"),
    ("leave/drain", receive9.Subscriber, "close"),
    ("leave/drain", repair9, "drain_window"),
    ("free stack", freestack, "pop"),
    ("free stack", freestack, "push"),
    ("free stack", freestack, "release_slot"),
)
# Two publishers sending 1 + 2 messages through a ring of one entry (wrap,
# takeover, eviction) and a pool of two (every slot reused) to a polling
# subscriber; for the steals, two publishers, one of which may die (no
# reader: an idle ring), explored with at least one preemption (a death
# costs one: without it no lock is ever stolen); for the wake, a subscriber
# asleep on the futex.
SCENARIO9 = Scenario9(sends=(1, 2), pool=2)
SCENARIOS9 = {"steal": Scenario9(subscribers=0, idle=1, deaths=1), "wake": Scenario9(publishers=1, blocking=True),
              "blocking receive": Scenario9(publishers=1, blocking=True)}
PREEMPTIONS9 = {"steal": 1}  # the least preemptions a flow needs to be reached

ONE_STEP_WEAKER = {"relaxed": (), "acquire": ("relaxed",), "release": ("relaxed",),
                   "acq_rel": ("release", "acquire"), "seq_cst": ("acq_rel",)}
PACKAGE_ROOT = pathlib.Path(publisher.__file__).parent.parent
SPEC_ORDERS = MUTANTS["spec-seqlock-orders"]  # the spec's orders, where the code's are stronger


@dataclass(frozen=True)
class Site:
    """One call of the door in a flow."""

    flow: str
    owner: object
    attribute: str
    function: str  # its qualified name
    path: str  # the file, relative to the package's root
    line: int
    operation: str  # e.g. cas_acq_rel_u64
    source: str  # the line, stripped

    def weaker(self, order: str) -> str:
        """The operation with ``order`` instead of its own."""
        kind_and_order, width = self.operation.rsplit("_", 1)
        return f"{kind_and_order[: -len(OPERATIONS[self.operation].order)]}{order}_{width}"


@dataclass
class Row:
    """A site, an order one step weaker, and what the exploration found."""

    site: Site
    order: str  # the code's order
    spec_order: str | None  # the spec's order, where the code's is stronger (else None)
    weakened: str | None  # None: relaxed already, nothing weaker
    result: str  # "counter-example", "none within bounds", "not reached", "undecided" or "-"
    report: Report | None = None

    def to_dict(self) -> dict[str, object]:
        report = self.report
        return {
            "file": self.site.path, "line": self.site.line, "function": self.site.function, "flow": self.site.flow,
            "operation": self.site.operation, "order": self.order, "spec_order": self.spec_order,
            "weakened_to": self.weakened, "result": self.result,
            "schedules": report and report.schedules, "seconds": report and round(report.seconds, 1),
            "violation": report and report.violation and report.violation.splitlines()[0],
        }


def _door_calls(source: str) -> list[tuple[int, str]]:
    """(line, operation) of every call of the door in ``source``."""
    return [(node.lineno, node.func.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in OPERATIONS]


def sites(flows: tuple[tuple[str, object, str], ...] | None = None) -> list[Site]:
    """Every call of the door in ``flows`` (None: layout 4's), in file order."""
    found = []
    for flow, owner, attribute in FLOWS if flows is None else flows:
        function = getattr(owner, attribute)
        lines, first_line = inspect.getsourcelines(function)
        path = str(pathlib.Path(inspect.getfile(function)).relative_to(PACKAGE_ROOT))
        for line, operation in _door_calls(textwrap.dedent("".join(lines))):
            found.append(Site(flow, owner, attribute, function.__qualname__, path, first_line + line - 1, operation,
                              lines[line - 1].strip()))
    return sorted(found, key=lambda site: (site.path, site.line))


def spec_order(site: Site) -> str | None:
    """The spec's order of this site, if the code's is stronger (else None):
    the order of ``SPEC_ORDERS``'s edit of the site's line."""
    for patch in SPEC_ORDERS.patches:
        if (patch.owner, patch.attribute) == (site.owner, site.attribute):
            for edit in patch.edits:
                if edit.old == (site.source,):
                    return OPERATIONS[_door_calls(edit.new[0])[0][1]].order
    return None


def weakening(site: Site, order: str) -> Mutant:
    """A mutant that calls ``site``'s operation with ``order`` instead; the
    edit takes the lines above the call that make it unique in its function."""
    lines, first_line = inspect.getsourcelines(getattr(site.owner, site.attribute))
    lines = textwrap.dedent("".join(lines)).split("\n")
    stripped = [line.strip() for line in lines]
    at = site.line - first_line
    for start in range(at, -1, -1):
        context = stripped[start : at + 1]
        if sum(stripped[i : i + len(context)] == context for i in range(len(lines))) == 1:
            break
    indent = len(lines[start]) - len(lines[start].lstrip())
    if any(line.strip() and len(line) - len(line.lstrip()) < indent for line in lines[start : at + 1]):
        raise RuntimeError(f"no unique edit for {site.path}:{site.line}")
    new = [line[indent:] for line in lines[start : at + 1]]
    new[-1] = new[-1].replace(site.operation + "(", site.weaker(order) + "(")
    edit = Edit(tuple(context), tuple(new))
    return Mutant(f"{site.function}:{site.line}:{order}", f"{site.operation} needs its order",
                  (Patch(site.owner, site.attribute, (edit,)),), model="ra")


def check_orders(
    preemptions: int = 1, stale: int = 2, budget: int | None = 2, progress: Callable[[Row], object] | None = None,
    layout: int = 4, reduction: str = "por",
) -> list[Row]:
    """Weaken every order of layout 4's (or 9's) flows one step in turn and
    explore the flows under ra within the bounds; ``progress(row)`` is
    called as each row is done."""
    baselines: dict[tuple[Scenario | Scenario9, int], tuple[Report, set[tuple[str, int]]]] = {}  # (flow scenario,
    # preemptions) -> (the unmutated flows' report, the (function, line) pairs they reached)
    rows = []
    for site in sites() if layout == 4 else sites(FLOWS9):
        scenario = SCENARIOS.get(site.flow, Scenario()) if layout == 4 else SCENARIOS9.get(site.flow, SCENARIO9)
        bound = preemptions if layout == 4 else max(preemptions, PREEMPTIONS9.get(site.flow, 0))
        if (scenario, bound) not in baselines:
            reached: set[tuple[str, int]] = set()

            def observe(outcome: Outcome, reached: set[tuple[str, int]] = reached) -> None:
                reached.update((step.where, step.line) for step in outcome.steps)

            baseline = explore(scenario, preemptions=bound, memory_model="ra", stale=stale, budget=budget,
                               observe=observe, reduction=reduction)
            baselines[(scenario, bound)] = (baseline, reached)
        baseline, reached = baselines[(scenario, bound)]
        order = OPERATIONS[site.operation].order
        weaker_orders = ONE_STEP_WEAKER[order]
        if OPERATIONS[site.operation].kind == "store" and order == "seq_cst":
            weaker_orders = ("release",)  # a store has no acquire part
        if not weaker_orders:
            rows.append(Row(site, order, spec_order(site), None, "-"))
        for weaker in weaker_orders:
            row = Row(site, order, spec_order(site), weaker, "undecided", baseline)
            if baseline.violation is None:
                row.report = explore(scenario, weakening(site, weaker), bound, memory_model="ra", stale=stale,
                                     budget=budget, reduction=reduction)
                if row.report.violation:
                    row.result = "counter-example"
                elif (site.function, site.line) in reached:
                    row.result = "none within bounds"
                else:
                    row.result = "not reached"
            rows.append(row)
            if progress:
                progress(row)
    return rows


def _first_line(violation: str | None) -> str:
    return violation.splitlines()[0] if violation else ""


def format_table(rows: list[Row]) -> str:
    """The rows as a table: site, function, operation, order, weakened to, result."""
    header = ("site", "function", "operation", "order", "weakened to", "result")
    table = [header]
    for row in rows:
        report = row.report
        if report is None:  # "-"
            result = "- (relaxed: nothing weaker)"
        elif row.result == "counter-example":
            result = f"counter-example after {report.schedules} schedules: {_first_line(report.violation)}"
        elif row.result in ("none within bounds", "not reached"):
            result = f"{row.result} ({report.schedules} schedules)"
        else:  # "undecided"
            result = f"undecided: the unmutated flows already fail here ({_first_line(report.violation)})"
        order = f"{row.order} (spec: {row.spec_order})" if row.spec_order else row.order
        table.append((f"{row.site.path}:{row.site.line}", row.site.function, row.site.operation, order,
                      row.weakened or "-", result))
    widths = [max(len(line[column]) for line in table) for column in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]
                     for line in table)
