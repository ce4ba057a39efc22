"""The package's layout (issue 29): no import cycles, ``__all__`` in every
public module and ``import *`` giving it, every exception users see in
``kickmsg.errors``, and the module paths that moved still working, with a
warning, for one release.
"""
import ast
import importlib
import inspect
import pathlib
import re
import subprocess
import sys
import tomllib
import warnings
from collections.abc import Collection

import pytest

import kickmsg
from kickmsg import errors
from kickmsg._moved import MOVED

PACKAGE = pathlib.Path(kickmsg.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "explanation" / "architecture.md"

# Exceptions that stay with their tool: caught inside it, or (SetupError) the
# verification tool's own refusal, not a fault of a channel.
INTERNAL_EXCEPTIONS = {
    "kickmsg.cli.common.CommandError",  # becomes the command's one-line error and exit status
    "kickmsg.verify.crosscheck.Crashed",
    "kickmsg.verify.crosscheck.OtherFailed",
    "kickmsg.verify.crosscheck.SetupError",  # bad input, or no other implementation to run
    "kickmsg.verify.crossdriver.Absent",  # the driver runs in the other implementation too: it imports nothing of ours
    "kickmsg.verify.scheduler.Aborted",
}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split(".")) and name not in MOVED


def type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def imports_of(name: str, source: str, package: str, modules: Collection[str], for_the_type_checker: bool = False) -> set[str]:
    """Which of ``modules`` module ``name`` (of ``package``) imports, at
    module level or in a function (and under ``if TYPE_CHECKING:`` with
    ``for_the_type_checker``): ``from kickmsg.a import b`` is
    ``kickmsg.a.b`` when that is a module, else ``kickmsg.a``."""
    tree = ast.parse(source)
    skipped = set() if for_the_type_checker else type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {module for module in found if module in modules and module != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                lowest[module] = min(lowest[module], lowest[imported])
            elif imported in stack:
                lowest[module] = min(lowest[module], index[imported])
        if lowest[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def import_graph(for_the_type_checker: bool = False) -> dict[str, set[str]]:
    return {name: imports_of(name, path.read_text(encoding="utf-8"),
                             name if path.name == "__init__.py" else name.rpartition(".")[0], MODULES, for_the_type_checker)
            for name, path in MODULES.items()}


def test_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    described = ["; ".join(f"{module} imports {', '.join(sorted(graph[module] & set(component)))}" for module in component)
                 for component in found]
    assert not found, "import cycles: " + " | ".join(described)


def test_a_cycle_through_a_function_counts_and_one_for_the_type_checker_does_not():
    sources = {
        "kickmsg.a": "from kickmsg import b\n",
        "kickmsg.b": "def late():\n    from .a import x\n",
        "kickmsg.c": "import kickmsg.a\nif TYPE_CHECKING:\n    from kickmsg.d import y\n",
        "kickmsg.d": "from kickmsg.c import z\n",
    }
    graph = {name: imports_of(name, source, "kickmsg", sources) for name, source in sources.items()}
    assert graph == {"kickmsg.a": {"kickmsg.b"}, "kickmsg.b": {"kickmsg.a"}, "kickmsg.c": {"kickmsg.a"}, "kickmsg.d": {"kickmsg.c"}}
    assert cycles(graph) == [["kickmsg.a", "kickmsg.b"]]


# The layers (issue 35): the protocol cores at the bottom, the API above them,
# the tools above the API. A module of a layer imports nothing of a layer above.
API_MODULES = {"kickmsg.region", "kickmsg.publisher", "kickmsg.subscriber", "kickmsg.waitset", "kickmsg.aio",
               "kickmsg.node", "kickmsg.typed"}
TOOLS = {"kickmsg.ops", "kickmsg.cli", "kickmsg.recording", "kickmsg.bridge", "kickmsg.spark", "kickmsg.verify"}
# Imports that break the rule today, being removed (issue 35); empty this set once they are gone.
KNOWN_UPWARD_IMPORTS = {
    ("kickmsg.publisher", "kickmsg.ops.audit"),  # explain_empty_pool: the empty-pool explanation moves to the tool that shows it
}


def in_any(module: str, packages: Collection[str]) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one."""
    return any(module == package or module.startswith(package + ".") for package in packages)


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs in which a module imports from a layer above its own:
    protocol/ from the API, the tools or the package itself; the API from the tools."""
    found = set()
    for name, imported in graph.items():
        if in_any(name, ["kickmsg.protocol"]):
            found.update((name, module) for module in imported if module == "kickmsg" or in_any(module, API_MODULES | TOOLS))
        elif name in API_MODULES:
            found.update((name, module) for module in imported if in_any(module, TOOLS))
    return found


def test_layers_import_only_downward():
    """Read from every module's import statements (those for the type checker too), nothing imported."""
    found = upward_imports(import_graph(for_the_type_checker=True))
    assert found <= KNOWN_UPWARD_IMPORTS, f"upward imports: {sorted(found - KNOWN_UPWARD_IMPORTS)}"


def test_an_upward_import_is_found_in_a_function_and_for_the_type_checker():
    sources = {
        "kickmsg.protocol.v4.x": "def late():\n    from kickmsg.publisher import Publisher\n",
        "kickmsg.protocol.v9.y": "if TYPE_CHECKING:\n    from kickmsg import ops\n",
        "kickmsg.publisher": "from kickmsg.cli import common\nfrom kickmsg.protocol.v4 import x\n",
        "kickmsg.ops": "", "kickmsg.cli.common": "", "kickmsg.owners": "from kickmsg import region\n", "kickmsg.region": "",
    }
    graph = {name: imports_of(name, source, name.rpartition(".")[0], sources, for_the_type_checker=True)
             for name, source in sources.items()}
    assert upward_imports(graph) == {("kickmsg.protocol.v4.x", "kickmsg.publisher"), ("kickmsg.protocol.v9.y", "kickmsg.ops"),
                                     ("kickmsg.publisher", "kickmsg.cli.common")}


def public_modules() -> list[str]:
    return [name for name in MODULES if is_public(name)]


@pytest.mark.parametrize("name", public_modules())
def test_public_module_has_all_and_star_import_gives_it(name):
    module = importlib.import_module(name)
    promised = getattr(module, "__all__", None)
    assert promised is not None, f"{name} has no __all__"
    assert len(set(promised)) == len(promised), f"{name}.__all__ names a name twice"
    namespace: dict = {}
    exec(f"from {name} import *", namespace)
    del namespace["__builtins__"]
    assert sorted(namespace) == sorted(promised)


def test_kickmsg_exports_every_error():
    assert set(errors.__all__) <= set(kickmsg.__all__)
    for name in errors.__all__:
        error = getattr(kickmsg, name)
        assert issubclass(error, Exception) and error.__module__ == "kickmsg.errors" and error is getattr(errors, name)


def test_every_exception_users_see_is_in_errors():
    """A class deriving from an exception anywhere else in the package is one of the tools' internal ones."""
    elsewhere = set()
    for name in public_modules():
        if name == "kickmsg.errors":
            continue
        for value in vars(importlib.import_module(name)).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                elsewhere.add(f"{name}.{value.__qualname__}")
    assert elsewhere == INTERNAL_EXCEPTIONS


# Outside the root on purpose (kickmsg.errors says why).
OUTSIDE_THE_ROOT = {
    "kickmsg.verify.crossdriver.Absent",  # also runs in the native library's interpreter: imports nothing of ours
    "kickmsg.verify.scheduler.Aborted",  # a BaseException: no `except Exception` of the code explored may swallow it
}


def test_every_exception_the_package_defines_derives_from_kickmsg_error():
    """Keeping its built-in base: a KickmsgError is still what a caller of either implementation catches."""
    defined = {}
    for name in public_modules():
        for value in vars(importlib.import_module(name)).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == name:
                defined[f"{name}.{value.__qualname__}"] = value
    assert {name for name, error in defined.items() if not issubclass(error, errors.KickmsgError)} == OUTSIDE_THE_ROOT
    assert issubclass(errors.PoolEmptyError, BlockingIOError) and issubclass(errors.RecordingError, ValueError)
    assert issubclass(errors.CapacityError, RuntimeError) and issubclass(errors.ConfigMismatchError, RuntimeError)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_moved_path_warns_and_gives_the_same_objects(old):
    new = importlib.import_module(MOVED[old])
    shim = importlib.import_module(old)
    for name in new.__all__:
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
            assert getattr(shim, name) is getattr(new, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            shim.__path__  # the import system's look-ups neither warn nor find anything
        with pytest.raises(AttributeError, match=f"module '{old}' has no attribute 'no_such_name' \\(it moved to"):
            shim.no_such_name  # nothing to import from the new path: no advice to


def test_old_import_statements_work_and_warn():
    """What users wrote (README, examples of the last release) in a fresh
    interpreter: ``kickmsg.audit`` stays the function."""
    script = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "import kickmsg\n"
        "from kickmsg import diagnostics\n"  # the module itself: no warning until an attribute is used
        "import kickmsg.audit\n"
        "assert callable(kickmsg.audit) and kickmsg.audit.__module__ == 'kickmsg.ops.audit'\n"
        "try:\n"
        "    from kickmsg.record import Recorder\n"
        "except DeprecationWarning as warning:\n"
        "    print(warning)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("kickmsg.record moved to kickmsg.recording.record: import Recorder from")


ORDERS_OF_AUDIT = {
    "function first": (
        "import kickmsg\n"
        "assert kickmsg.audit is kickmsg.ops.audit.audit\n"
        "with pytest.warns(DeprecationWarning, match='kickmsg.audit moved to kickmsg.ops.audit'):\n"
        "    from kickmsg.audit import audit\n"
        "assert audit is kickmsg.audit is kickmsg.ops.audit.audit\n"
    ),
    "old path first": (
        "with pytest.warns(DeprecationWarning, match='kickmsg.audit moved to kickmsg.ops.audit'):\n"
        "    from kickmsg.audit import audit\n"
        "import kickmsg\n"
        "import kickmsg.audit\n"
        "assert audit is kickmsg.audit is kickmsg.ops.audit.audit\n"
    ),
}


@pytest.mark.parametrize("order", sorted(ORDERS_OF_AUDIT))
def test_audit_stays_the_function_whatever_is_imported_first(order):
    """``kickmsg.audit`` is the function and an old module path: a fresh
    interpreter per order, since the first import decides."""
    script = "import warnings, pytest\nwarnings.simplefilter('error')\n" + ORDERS_OF_AUDIT[order] + (
        "region = kickmsg.SharedRegion.create('/kp35err_audit', kickmsg.ChannelType.PubSub, kickmsg.Config(), 'test')\n"
        "try:\n"
        "    assert kickmsg.audit(region).clean\n"
        "finally:\n"
        "    kickmsg.unlink_shm('/kp35err_audit')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_an_old_path_is_an_attribute_of_its_package_once_imported():
    """What the import system gives a module it loads, as with the old stub files."""
    script = (
        "import warnings, pytest\n"
        "warnings.simplefilter('error')\n"
        "import kickmsg.ops.owners, kickmsg.diagnostics, kickmsg.owners, kickmsg.ops.diagnostics\n"
        "with pytest.warns(DeprecationWarning, match='kickmsg.ops.owners moved to kickmsg.owners'):\n"
        "    assert kickmsg.ops.owners.read_owners is kickmsg.owners.read_owners\n"
        "with pytest.warns(DeprecationWarning, match='kickmsg.diagnostics moved to kickmsg.ops.diagnostics'):\n"
        "    assert kickmsg.diagnostics.info is kickmsg.ops.diagnostics.info\n"
        "import kickmsg.diagnostics as again\n"
        "assert again is kickmsg.diagnostics and again.__doc__.startswith('Moved to')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_architecture_page_names_every_module_and_only_those():
    """Each module of the package, or its subpackage, has a row in the
    page's module table, and every path the table names exists."""
    rows = [line for line in ARCHITECTURE.read_text(encoding="utf-8").split("## Modules")[1].split("\n## ")[0].splitlines()
            if line.startswith("| `kickmsg")]
    named = {path for row in rows for path in re.findall(r"`(kickmsg/[^`]*)`", row.split(" | ")[0])}
    assert all((PACKAGE.parent / path).exists() for path in named), sorted(p for p in named if not (PACKAGE.parent / p).exists())
    files = [path.relative_to(PACKAGE.parent) for path in PACKAGE.rglob("*") if path.suffix in (".py", ".c")]
    shims = {pathlib.Path(*old.split(".")).with_suffix(".py") for old in MOVED}

    def has_a_row(file: pathlib.Path) -> bool:  # its own, its directory's, or for a package's __init__.py one of its modules'
        directory = f"{file.parent}/"
        return (str(file) in named or any(directory.startswith(path) for path in named if path.endswith("/"))
                or (file.name == "__init__.py" and any(path.startswith(directory) for path in named)))

    unnamed = [str(file) for file in files if file not in shims and file.name != "_moved.py" and not has_a_row(file)]
    assert not unnamed, f"modules without a row in {ARCHITECTURE.name}: {sorted(unnamed)}"


def test_every_package_is_installed():
    """pyproject.toml lists the packages a wheel (not only an editable install) carries."""
    with open(PACKAGE.parent / "pyproject.toml", "rb") as file:
        listed = tomllib.load(file)["tool"]["setuptools"]["packages"]
    packages = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")
    assert sorted(listed) == packages
