"""Mutation analysis of the flows (``kickmsg verify --mutations``).

Mutants are derived from the flows' own source (the functions of
``kickmsg.verify.orders.FLOWS``, layout 4, and ``FLOWS9``, layout 9) with
the ``ast`` module, by these operators:

- ``drop-condition``: the test of an ``if``, ``elif``, ``while`` or
  conditional expression replaced by ``True`` (the check removed);
- ``negate-condition``: the same test replaced by ``not (test)``;
- ``drop-operand``: one operand of an ``and`` / ``or`` removed;
- ``move-bound``: a comparison's bound moved by one: ``<`` <-> ``<=``,
  ``>`` <-> ``>=``, ``a == b`` -> ``a == b + 1``, ``a != b`` -> ``a != b + 1``;
- ``weaken-to-ORDER``: a call of the atomics door with its memory order
  weakened one step (``orders.weakening``, as ``--orders`` does), explored
  under the ra model only (under sequential consistency it changes nothing);
- ``remove-step``: a simple statement that calls the door replaced by ``pass``;
- ``swap-steps``: such a statement swapped with its neighbour statement in
  the same block (the one below, and the one above unless that one is a
  step too: each pair once).

A test that is a constant (``while True``) is no check and gets no
condition mutant. Every mutant keeps its function's line count (an
expression spanning lines is padded inside parentheses), so traces name
the real lines. A mutant whose source does not parse, or parses to the
same tree as the original (equivalent by construction), is skipped and
counted. Each mutant's id is ``path:line operator`` (``#2``... when one
line has several of the same operator), stable while the code does not
move.

Each mutant is explored over the layout's scenario set (``TRIALS``), in
turn, until one of them kills it: a violation of the invariants, an actor
that raises, or a livelock (no end after ``MAX_STEPS`` steps, about nine
times the longest execution of the unmutated flows: a flow that never
returns, or busy-waits where it should sleep, is a failure of the flow as
much as a lost message). A mutant no scenario kills survived.
"""
import ast
import contextlib
import functools
import inspect
import pathlib
import sys
import textwrap
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from kickmsg.verify import MUTANT_SCENARIOS, Report, Scenario, Scenario9, explore, orders
from kickmsg.verify.layout9 import EVICTION, MUTANT_SCENARIOS9
from kickmsg.verify.memory import HARDWARE_OPERATIONS, OPERATIONS
from kickmsg.verify.mutants import Mutant, Patch

__all__ = [
    "Analysis", "Derived", "OPERATORS", "Result", "SPIN_LIMIT", "Spins", "TRIALS", "TRIALS4_SURVIVORS",
    "TRIALS9_PUBLISH", "TRIALS9_RECEIVE", "Trial", "derive",
    "format_table", "run",
]

# An execution of a mutation run is a livelock after this many steps: the
# unmutated flows' longest in any trial of either layout is 230 (layout 4's
# two subscribers; layout 9's: 111). A mutant that turns a blocking receive's
# park into 100 us naps until its deadline (1 s of modelled time) would
# otherwise run ten thousand naps per execution, in every schedule.
MAX_STEPS = 2_000

OPERATORS = ("drop-condition", "negate-condition", "drop-operand", "move-bound", "weaken-order", "remove-step",
             "swap-steps")


@dataclass(frozen=True)
class Trial:
    """A scenario of the set, explored with at least ``least_preemptions``
    preemptions (what it needs to reach the flow it was made for) and at
    most ``most_preemptions`` (the unmutated flows pass it within those),
    under the memory ``models`` given."""

    scenario: Scenario | Scenario9
    least_preemptions: int = 0
    most_preemptions: int = 8
    models: tuple[str, ...] = ("sc", "ra")

    def preemptions(self, asked: int) -> int:
        """The bound explored when ``asked`` is the run's."""
        return min(max(asked, self.least_preemptions), self.most_preemptions)


def _unique(trials: list[Trial]) -> tuple[Trial, ...]:
    return tuple(dict.fromkeys(trials))


# Layout 9's receive and repair (docs/explanation/verification.md, "Arguments:
# layout 9's receive and repair"): one publisher's message into a pool of one
# slot (so slot 0 carries it: the claim checks of pin_next and drain_window
# at their bounds; and of the largest length, so the length check at its
# bound), a polling subscriber, one preemption (a subscriber between its
# claim and its drain floor, or sees the entry claimed, not committed). With
# rules 8-11 it kills the pin_next survivors that lose a message without
# cause (228, 229, 233, 241, 261, 268), the join's drain floor read after
# the claim (170 swap-steps) and its owner_pid never recorded (177
# remove-step), the leave's owner left behind (440, 441 remove-step) or its
# window not drained (445 negate-condition; drain_window 232).
TRIALS9_RECEIVE = (
    Trial(Scenario9(sends=(0, 1), pool=1), least_preemptions=1, models=("sc",)),
    # A subscriber that joins and at once leaves and a reading subscriber
    # sharing one ring (each waits for the other's leave), one publisher, one
    # preemption, under sc: a join between a leave's steps (the leave stores
    # Free last, 445 swap-steps; 223 schedules).
    Trial(Scenario9(publishers=1, messages=1, subscribers=1, leavers=1, rings=1), least_preemptions=1,
          models=("sc",)),
)

# Layout 4's trials for the survivors of the flows (docs/explanation/verification.md, "Arguments: the free stack
# and layout 4"), under sc:
TRIALS4_SURVIVORS = (
    # A ring joined before the run and left after it, a pool of 3 (it runs dry), one preemption (two pops or an
    # admission and a leave contend): a publish that skips a Live ring (the find and admission checks), a join
    # that ignores its CAS, a pop that reports the pool dry while slots are free or that takes the empty pool for a
    # corrupt one, a pop or push that ignores its CAS, an eviction that captures an uncommitted entry.
    Trial(Scenario(subscribers=0, idle=1, pool=3), least_preemptions=1, most_preemptions=1, models=("sc",)),
    # One publisher of two messages and a subscriber that joins, leaves and joins again on a ring that never
    # wraps, two preemptions: a leave or a join between a publisher's pre-check and its admission (the admission
    # loop's checks, a claim before the admission check), a push that ignores its CAS, and every loss a receive
    # counts without an overwrite (the locked and the sequence checks, the entry's sanity check, the seqlock
    # re-check, the pin loop).
    Trial(Scenario(publishers=1, messages=2, subscribers=1), least_preemptions=2, most_preemptions=2, models=("sc",)),
    # One publisher of three messages and a reader on a ring of one, two preemptions: the publisher evicts the
    # entry the reader is pinning (the pin loop's bounds and its CAS check).
    Trial(Scenario(publishers=1, messages=3, subscribers=1, rejoin=False, capacity=1, pool=3), least_preemptions=2,
          most_preemptions=2, models=("sc",)),
)

# Layout 9's publish (docs/explanation/verification.md, "Arguments: layout
# 9's publish"): a publisher wrapping a ring of 2 while a second ring stays
# Free (the first lap's prev_seq, 178 drop-condition; the references no
# ring took, 239 drop-condition).
TRIALS9_PUBLISH = (
    Trial(Scenario9(publishers=1, messages=3, rings=2, capacity=2)),
    # A subscriber that joins and at once leaves while one publisher sends two
    # messages, four preemptions, under sc: a leave between a publisher's
    # pre-check and its admission (the admission loop's Live check, 162), and
    # a publisher admitted during the leave (the leave's CASes and its retire
    # branch, receive.py 425-452: "R8" in the docs; 1 188 schedules).
    Trial(Scenario9(publishers=1, messages=2, subscribers=0, leavers=1), least_preemptions=4, models=("sc",)),
)

# Each layout's scenario set: those of the named mutants and of the --orders
# tables. On layout 4, two subscribers (for refcount-per-ring) and the
# blocking receive (for park-without-waiter, which fails under ra without a
# fence, "Weak memory" in docs/explanation/verification.md) are explored
# under sc only; the repair pass racing traffic fails with one preemption,
# and under ra with none ("a repair pass under traffic", "second finding"):
# explored under sc with none. On layout 9, each named mutant's scenario is
# explored with the preemptions that mutant needs (the steal, takeover and
# commit paths are reached only with them), the eviction's with one and
# under sc only (at two, 34 000 schedules, and under ra, 8 000 at one, it is
# the named mutants' business). Then the trials above, added for the
# survivors.
TRIALS = {
    4: _unique([Trial(scenario, models=("sc",) if scenario != Scenario() else ("sc", "ra"))
                for scenario in MUTANT_SCENARIOS.values()]
               + [Trial(Scenario(repairer=True), most_preemptions=0, models=("sc",))] + list(TRIALS4_SURVIVORS)),
    9: _unique([Trial(orders.SCENARIO9)]
               + [Trial(scenario, least_preemptions=preemptions)
                  for scenario, preemptions, _ in MUTANT_SCENARIOS9.values() if scenario != EVICTION]
               + [Trial(EVICTION, least_preemptions=1, models=("sc",))]
               + [Trial(scenario, least_preemptions=orders.PREEMPTIONS9.get(name, 0))
                  for name, scenario in orders.SCENARIOS9.items()]
               + list(TRIALS9_RECEIVE) + list(TRIALS9_PUBLISH)),
}


@dataclass(frozen=True)
class Derived:
    """A mutant derived from the flows, and what it changes."""

    id: str  # "protocol/v9/publish.py:123 negate-condition"
    operator: str
    flow: str
    function: str  # qualified name
    before: tuple[str, ...]  # the changed lines, stripped
    after: tuple[str, ...]
    mutant: Mutant = field(repr=False)


@dataclass
class Result:
    """What the exploration did to a mutant."""

    derived: Derived
    killed: bool
    schedules: int  # in all, over the scenarios explored
    seconds: float
    scenario: str | None = None  # the one that killed it
    violation: str | None = None  # its first line

    def to_dict(self) -> dict[str, object]:
        return {"id": self.derived.id, "operator": self.derived.operator, "function": self.derived.function,
                "before": list(self.derived.before), "after": list(self.derived.after),
                "result": "killed" if self.killed else "survived", "scenario": self.scenario,
                "violation": self.violation, "schedules": self.schedules, "seconds": round(self.seconds, 2)}


def _door_call(node: ast.AST) -> bool:
    return any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
               and call.func.attr in HARDWARE_OPERATIONS for call in ast.walk(node))


def _replaced(lines: list[str], node: ast.expr, text: str, pad: bool = True) -> list[str]:
    """``lines`` with ``node``'s source replaced by ``text``, padded to as
    many lines (inside parentheses) when the node spans several, unless
    ``text`` has its lines already (``pad`` False)."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    first, last = node.lineno - 1, node.end_lineno - 1
    head = lines[first].encode()[: node.col_offset].decode()
    tail = lines[last].encode()[node.end_col_offset :].decode()
    if first != last and pad:
        text = "(" + text + "\n" * (last - first) + ")"
    return lines[:first] + (head + text + tail).split("\n") + lines[last + 1 :]


def _statements_swapped(lines: list[str], upper: ast.stmt, lower: ast.stmt) -> list[str]:
    assert upper.end_lineno is not None and lower.end_lineno is not None
    top, middle, bottom = (lines[upper.lineno - 1 : upper.end_lineno], lines[upper.end_lineno : lower.lineno - 1],
                           lines[lower.lineno - 1 : lower.end_lineno])
    return lines[: upper.lineno - 1] + bottom + middle + top + lines[lower.end_lineno :]


def _statement_removed(lines: list[str], statement: ast.stmt) -> list[str]:
    assert statement.end_lineno is not None
    first = lines[statement.lineno - 1]
    indent = first[: len(first) - len(first.lstrip())]
    return (lines[: statement.lineno - 1] + [indent + "pass"] + [""] * (statement.end_lineno - statement.lineno)
            + lines[statement.end_lineno :])


def _expression_mutants(tree: ast.AST, lines: list[str]) -> list[tuple[str, ast.expr | ast.stmt, list[str]]]:
    """(operator, node changed, new lines) of every condition, operand and
    comparison mutant of a function's source."""
    found: list[tuple[str, ast.expr | ast.stmt, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)) and not isinstance(node.test, ast.Constant):
            test = node.test
            found.append(("drop-condition", test, _replaced(lines, test, "True")))
            found.append(("negate-condition", test, _replaced(lines, test, f"not ({ast.unparse(test)})")))
        elif isinstance(node, ast.BoolOp):
            for index in range(len(node.values)):
                rest = node.values[:index] + node.values[index + 1 :]
                kept = rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)
                found.append(("drop-operand", node, _replaced(lines, node, f"({ast.unparse(kept)})")))
        elif isinstance(node, ast.Compare):
            for index, op in enumerate(node.ops):
                moved = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}.get(type(op))
                comparators = list(node.comparators)
                ops = list(node.ops)
                if moved is not None:
                    ops[index] = moved()
                elif isinstance(op, (ast.Eq, ast.NotEq)) and not (
                        isinstance(bound := comparators[index], ast.Constant) and not isinstance(bound.value, int)):
                    comparators[index] = ast.BinOp(comparators[index], ast.Add(), ast.Constant(1))
                else:
                    continue
                changed = ast.Compare(node.left, ops, comparators)
                found.append(("move-bound", node, _replaced(lines, node, f"({ast.unparse(changed)})")))
    return found


def _step_mutants(tree: ast.AST, lines: list[str]) -> list[tuple[str, ast.expr | ast.stmt, list[str]]]:
    """(operator, first statement changed, new lines) of every step removed
    or swapped with its neighbour."""
    found: list[tuple[str, ast.expr | ast.stmt, list[str]]] = []
    for node in ast.walk(tree):
        for block in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
            if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
                continue
            steps = [isinstance(statement, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return))
                     and _door_call(statement) for statement in block]
            for index, statement in enumerate(block):
                if steps[index]:
                    found.append(("remove-step", statement, _statement_removed(lines, statement)))
                if index + 1 < len(block) and (steps[index] or steps[index + 1]):
                    found.append(("swap-steps", statement, _statements_swapped(lines, statement, block[index + 1])))
    return found


SPIN_LIMIT = 100_000  # loop iterations in one call of a mutant: far more than any flow's (bounded by the region)


class Spins:
    """The loop iterations of one call of a mutant (``_guarded``)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> bool:
        self.count += 1
        if self.count > SPIN_LIMIT:
            raise RuntimeError(f"a loop of the mutant went round {SPIN_LIMIT} times in one call: it never ends")
        return True


def _guarded(source: str, tree: ast.Module) -> str:
    """``source`` (whose tree is ``tree``) with every ``while`` test counted
    by a ``Spins`` of the call: a mutant that loops forever outside the
    scheduler (which stops its actors after ``max_steps``), in a scenario's
    setup or its repairs at the end, raises RuntimeError instead of hanging.
    Its lines stay where they were."""
    lines = source.split("\n")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    loops = [node for node in ast.walk(function) if isinstance(node, ast.While)]
    for loop in sorted(loops, key=lambda node: (node.test.lineno, node.test.col_offset), reverse=True):
        lines = _replaced(lines, loop.test, f"_mutant_spins() and ({_segment(lines, loop.test)})", pad=False)
    first = function.body[0]  # a simple statement (a docstring) in every flow
    assert first.end_lineno is not None and first.end_col_offset is not None
    end = lines[first.end_lineno - 1].encode()
    lines[first.end_lineno - 1] = (end[: first.end_col_offset] + b"; _mutant_spins = __import__("
                                   b"'kickmsg.verify.mutations', fromlist=['Spins']).Spins()"
                                   + end[first.end_col_offset :]).decode()
    return "\n".join(lines)


def _segment(lines: list[str], node: ast.expr) -> str:
    """``node``'s source text."""
    assert node.end_lineno is not None and node.end_col_offset is not None
    text = "\n".join(lines[node.lineno - 1 : node.end_lineno]).encode()
    end = len(text) - len(lines[node.end_lineno - 1].encode()) + node.end_col_offset
    return text[node.col_offset : end].decode()


def _next(tree: ast.AST, statement: ast.stmt) -> ast.stmt:
    """The statement after ``statement`` in its block."""
    for node in ast.walk(tree):
        for block in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
            if isinstance(block, list) and statement in block:
                return block[block.index(statement) + 1]
    raise LookupError(ast.unparse(statement))


def _heading(lines: list[str], statement: ast.stmt) -> str:
    """A statement's first line, stripped, with `...` if it has more."""
    return lines[statement.lineno - 1].strip() + (" ..." if statement.end_lineno != statement.lineno else "")


def _changed(old: list[str], new: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The lines that differ (from the first to the last that does), stripped."""
    differ = [index for index in range(len(old)) if old[index] != new[index]]
    first, last = differ[0], differ[-1]
    return (tuple(line.strip() for line in old[first : last + 1] if line.strip()),
            tuple(line.strip() for line in new[first : last + 1] if line.strip()))


def derive(layout: int = 4) -> tuple[list[Derived], dict[str, int]]:
    """Every mutant of layout 4's (or 9's) flows, in file order, and how
    many were skipped, by reason ("does not parse", "equivalent")."""
    flows = orders.FLOWS if layout == 4 else orders.FLOWS9
    derived: list[Derived] = []
    skipped = {"does not parse": 0, "equivalent": 0}
    for flow, owner, attribute in flows:
        function = getattr(owner, attribute)
        source_lines, first_line = inspect.getsourcelines(function)
        source = textwrap.dedent("".join(source_lines))
        lines = source.split("\n")
        tree = ast.parse(source)
        path = str(pathlib.Path(inspect.getfile(function)).relative_to(orders.PACKAGE_ROOT / "kickmsg"))
        for operator, node, new_lines in _expression_mutants(tree, lines) + _step_mutants(tree, lines):
            assert len(new_lines) == len(lines), (operator, ast.unparse(node))
            new_source = "\n".join(new_lines)
            try:
                new_tree = ast.parse(new_source)
            except SyntaxError:
                skipped["does not parse"] += 1
                continue
            if ast.dump(new_tree) == ast.dump(tree):
                skipped["equivalent"] += 1
                continue
            before: tuple[str, ...]
            after: tuple[str, ...]
            if operator == "swap-steps":  # each statement by its first line
                assert isinstance(node, ast.stmt)
                upper, lower = _heading(lines, node), _heading(lines, _next(tree, node))
                before, after = (upper, lower), (lower, upper)
            else:
                before, after = _changed(lines, new_lines)
            line = first_line + node.lineno - 1
            mutant = Mutant(f"{path}:{line} {operator}", operator,
                            (Patch(owner, attribute, (), _guarded(new_source, new_tree)),))
            derived.append(Derived(mutant.name, operator, flow, function.__qualname__, before, after, mutant))
        for site in orders.sites(((flow, owner, attribute),)):
            order = OPERATIONS[site.operation].order
            weaker_orders = orders.ONE_STEP_WEAKER[order]
            if OPERATIONS[site.operation].kind == "store" and order == "seq_cst":
                weaker_orders = ("release",)  # a store has no acquire part
            for weaker in weaker_orders:
                mutant = orders.weakening(site, weaker)
                name = f"{path}:{site.line} weaken-to-{weaker}"
                derived.append(Derived(name, "weaken-order", flow, site.function, (site.source,),
                                       (site.source.replace(site.operation + "(", site.weaker(weaker) + "("),),
                                       replace(mutant, name=name)))
    derived.sort(key=lambda mutant: (mutant.id.split(":")[0], int(mutant.id.split(":")[1].split()[0])))
    return _numbered(derived), skipped


def _numbered(derived: list[Derived]) -> list[Derived]:
    """The mutants with ``#2``, ``#3``... after an id already taken."""
    seen: dict[str, int] = {}
    numbered = []
    for mutant in derived:
        seen[mutant.id] = seen.get(mutant.id, 0) + 1
        if seen[mutant.id] > 1:
            name = f"{mutant.id} #{seen[mutant.id]}"
            mutant = replace(mutant, id=name, mutant=replace(mutant.mutant, name=name))
        numbered.append(mutant)
    return numbered


@dataclass
class Analysis:
    """The results of ``run``: every mutant's, those skipped, and the
    scenarios left out under a model because the unmutated flows fail them
    at the bounds given."""

    results: list[Result]
    skipped: dict[str, int]  # reason -> mutants
    left_out: list[str]  # "scenario, under model: the violation"

    def summary(self) -> str:
        killed = sum(result.killed for result in self.results)
        return (f"{len(self.results)} mutants: {killed} killed, {len(self.results) - killed} survived, "
                f"{sum(self.skipped.values())} skipped ({self.skipped['equivalent']} equivalent by construction, "
                f"{self.skipped['does not parse']} not parsing)")

    def to_dict(self) -> dict[str, object]:
        return {"summary": self.summary(), "skipped": self.skipped, "left_out": self.left_out,
                "mutants": [result.to_dict() for result in self.results]}


def run(
    layout: int = 4, preemptions: int = 0, stale: int = 1, budget: int | None = None, max_schedules: int = 1_000_000,
    progress: Callable[[Result], object] | None = None, only: Callable[[Derived], bool] | None = None,
) -> Analysis:
    """Explore every mutant of the layout (those ``only`` accepts, if
    given) over its scenario set until one kills it: under sequential
    consistency, or ra for an order weakened (``stale`` stale reads,
    ``budget`` preemptions and stale reads together). A scenario the
    unmutated flows fail under a model at these bounds is left out under
    it. ``progress(result)`` is called as each mutant is done."""
    derived, skipped = derive(layout)
    trials: dict[str, list[Trial]] = {"sc": [], "ra": []}
    left_out = []
    for model, kept in trials.items():
        for trial in (trial for trial in TRIALS[layout] if model in trial.models):
            violation = _baseline_violation(trial, model, preemptions, stale, budget, max_schedules)
            if violation:
                left_out.append(f"{trial.scenario.describe()}, under {model}: {_first_line(violation)}")
            else:
                kept.append(trial)
    results = []
    for mutant in derived:
        if only is not None and not only(mutant):
            continue
        result = Result(mutant, False, 0, 0.0)
        for trial in trials["ra" if mutant.operator == "weaken-order" else "sc"]:
            try:
                report = _explore(trial, mutant.mutant, mutant.mutant.model, preemptions, stale, budget,
                                  max_schedules)
            except Exception as error:  # the scenario's setup or its repairs at the end ran the mutant, outside the actors
                result.killed, result.scenario = True, trial.scenario.describe()
                result.violation = f"raised outside the actors: {type(error).__name__}: {error}"
                break
            result.schedules += report.schedules
            result.seconds += report.seconds
            if report.violation:
                result.killed, result.scenario = True, trial.scenario.describe()
                result.violation = _first_line(report.violation)
                break
        results.append(result)
        if progress:
            progress(result)
    return Analysis(results, skipped, left_out)


def _first_line(violation: str) -> str:
    """A violation's first line; for an actor that raised, with the error."""
    lines = violation.strip().splitlines()
    return f"{lines[0]} {lines[-1].strip()}" if lines[0].endswith(" raised:") else lines[0]


@functools.cache
def _baseline_violation(trial: Trial, model: str, preemptions: int, stale: int, budget: int | None,
                        max_schedules: int) -> str | None:
    """The unmutated flows' violation of a trial at these bounds (None: none),
    explored once per process."""
    return _explore(trial, None, model, preemptions, stale, budget, max_schedules).violation


@contextlib.contextmanager
def _mutants_finalizers_quiet() -> Iterator[None]:
    """Drop the errors a mutant's code raises in a finalizer (a mutated
    ``Subscriber.close`` run by ``__del__`` after its schedule, outside the
    explorer): symptoms of the mutant, not results; anything else is reported."""
    report = sys.unraisablehook

    def hook(unraisable: "sys.UnraisableHookArgs") -> object:
        frames = traceback.extract_tb(unraisable.exc_traceback)
        return None if any(frame.filename.startswith("<mutant ") for frame in frames) else report(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = report


def _explore(trial: Trial, mutant: Mutant | None, model: str, preemptions: int, stale: int, budget: int | None,
             max_schedules: int) -> Report:
    with _mutants_finalizers_quiet():
        return explore(trial.scenario, mutant=mutant, preemptions=trial.preemptions(preemptions),
                       max_schedules=max_schedules, memory_model=model, stale=stale if model == "ra" else 0,
                       budget=budget if model == "ra" else None, max_steps=MAX_STEPS)


def format_table(results: list[Result]) -> str:
    """The results as a table: mutant, function, change, result."""
    header = ("mutant", "function", "change", "result")
    table = [header]
    for result in results:
        mutant = result.derived
        change = " / ".join(mutant.before) + "  ->  " + " / ".join(mutant.after)
        verdict = (f"killed ({result.scenario}): {result.violation}" if result.killed
                   else f"SURVIVED ({result.schedules} schedules)")
        table.append((mutant.id, mutant.function, change, verdict))
    widths = [max(len(line[column]) for line in table) for column in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1]
                     for line in table)
