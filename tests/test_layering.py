"""The package's layering, read from the source so that it cannot rot silently.

Every module under ``src/tidelog`` is parsed (not imported) and every import of a tidelog module
is checked against :data:`MAY_IMPORT`, the one table of which part may use which, and which
grants nothing the code does not use. On top of it: the broker, the cluster, the sites and the
control are used through their faces (their ``__init__``), never a submodule, and nothing above
the broker imports ``tidelog.log``; no front names the cluster (only the server, which builds
the control, knows the mode); the CLI loads the server and the console only inside the commands
that run them; no import cycle exists between modules, and no tidelog module is imported inside a
function (a late import is how a cycle gets hidden) except the entries of
:data:`LATE_IMPORTS_ALLOWED`, each with its reason.

Imports under ``if TYPE_CHECKING:`` count for the layer rules (a type is a dependency too) but
not for cycles (they never run).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

MAY_IMPORT: dict[str, set[str]] = {
    # the bottom: shared by every layer, importing no other part but these
    "errors": set(),
    "wire": {"_proto", "errors"},  # the v1 messages its codecs fill; the token's InvalidArgument
    "process": set(),
    "_proto": set(),
    "_crc32c": set(),  # the native CRC-32C pass (C, src/tidelog/native/): imports nothing
    "access": {"errors"},  # what a call touches, and the guard that checks it
    "durable": {"errors"},  # complete writes, atomic replacement, the fault seam; DiskFull
    "security": {"access", "errors"},  # identities, tokens, the ACL, TLS material
    # the server side, top to bottom: fronts -> guard -> control -> broker / cluster / sites
    # the CLI: a client application, plus `tidelog serve` (the api, loaded late)
    # (security: `tidelog token create` writes the tokens file, as the server reads it)
    "cli": {"api", "client", "console", "errors", "wire", "tidelog", "security"},
    # the api's fronts use the control; its server (the composition root) builds the control
    # from the broker, the cluster's face and the sites' face
    "api": {
        "access",
        "control",
        "broker",
        "sites",
        "cluster",
        "errors",
        "wire",
        "_proto",
        "security",
        "kafka",
    },
    "control": {"broker", "cluster", "sites", "errors", "wire", "_proto"},
    # the Kafka front: like the api's fronts it translates and calls the control; the broker's
    # face gives it the record types it appends and reads
    "kafka": {"access", "control", "broker", "errors", "security"},
    "broker": {"log", "store", "durable", "errors", "wire"},
    # security: the TLS a sender calls other sites with (this server's own certificate)
    "sites": {"broker", "durable", "errors", "wire", "_proto", "security"},
    # security: the TLS channels brokers call each other and etcd with (ClientTls, aio_channel)
    "cluster": {"broker", "durable", "errors", "wire", "_proto", "security"},
    "log": {"durable", "errors", "_crc32c"},
    "store": {"errors"},
    # talk to brokers only over gRPC, through the client
    "client": {"errors", "wire", "_proto", "security"},
    "spark": {"client", "errors", "wire"},
    # the web console: a client application, like spark (never the broker, the api or the log)
    "console": {"access", "client", "errors", "wire"},
    # the package root re-exports the client
    "tidelog": {"client"},
}
"""Part (the first name under ``tidelog``) -> the other parts it may import. ``tidelog`` is the
package root (``__version__``, the lazy client names). A new part (``cluster``,
``console``) must be added here before it can import anything."""

LATE_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {
    ("tidelog", "tidelog.client"): "the root loads the client on first use, so that importing "
    "tidelog.log alone does not pull in gRPC",
    ("tidelog.cli.app", "tidelog.api.server"): "only `tidelog serve` loads the server: every "
    "client command would otherwise pay for it at start",
    ("tidelog.cli.app", "tidelog.api.settings"): "the same, for the server's settings",
    ("tidelog.cli.app", "tidelog.console"): "only `tidelog serve` and `tidelog console` load the "
    "console (Starlette, Jinja2, uvicorn); other commands would pay for it at start",
}
"""(importing module, imported module) -> why that import happens inside a function."""


@dataclass(frozen=True)
class Import:
    module: str
    """the importing module"""
    target: str
    """the tidelog module imported"""
    line: int
    late: bool
    """inside a function"""
    typing_only: bool
    """under ``if TYPE_CHECKING:``"""

    def where(self) -> str:
        return f"{self.module} (line {self.line}) imports {self.target}"


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str:
    names = module.split(".")
    return names[1] if len(names) > 1 else names[0]


def resolve_from(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module a ``from`` import names (``level`` dots before ``name``)."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module = module
        self.is_package = is_package
        self.known = known
        self.found: list[Import] = []
        self._functions = 0
        self._typing = 0

    def _add(self, target: str, line: int) -> None:
        if target == "tidelog" or target.startswith("tidelog."):
            self.found.append(
                Import(self.module, target, line, self._functions > 0, self._typing > 0)
            )

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        guarded = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        self._typing += guarded
        for child in node.body:
            self.visit(child)
        self._typing -= guarded
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = resolve_from(self.module, self.is_package, node.level, node.module)
        for alias in node.names:
            # ``from tidelog import columns`` imports the module tidelog.columns
            candidate = f"{base}.{alias.name}"
            self._add(candidate if candidate in self.known else base, node.lineno)


def collect(src: Path) -> list[Import]:
    paths = sorted((src / "tidelog").rglob("*.py"))
    known = {module_name(p, src) for p in paths}
    found: list[Import] = []
    for path in paths:
        collector = _Collector(module_name(path, src), path.name == "__init__.py", known)
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        found += collector.found
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same node, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    found = collect(SRC)
    assert len({i.module for i in found}) > 50, "the walk found too few modules: is SRC right?"
    return found


def test_every_permission_of_the_table_is_used(imports: list[Import]) -> None:
    """``MAY_IMPORT`` is only as wide as the code: a permission nothing uses is removed (it
    would let a new import across layers in unnoticed)."""
    used: dict[str, set[str]] = {}
    for i in imports:
        if part_of(i.target) != part_of(i.module):
            used.setdefault(part_of(i.module), set()).add(part_of(i.target))
    unused = {
        part: sorted(allowed - used.get(part, set()))
        for part, allowed in MAY_IMPORT.items()
        if allowed - used.get(part, set())
    }
    assert not unused, f"permissions no module uses (remove them): {unused}"


def test_every_part_imports_only_what_the_table_allows(imports: list[Import]) -> None:
    unknown = sorted({part_of(i.module) for i in imports} - MAY_IMPORT.keys())
    assert not unknown, f"parts missing from MAY_IMPORT (add them with their rule): {unknown}"
    wrong = [
        i.where()
        for i in imports
        if part_of(i.target) != part_of(i.module)
        and part_of(i.target) not in MAY_IMPORT[part_of(i.module)]
    ]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


FACES = ("broker", "cluster", "sites", "control")
"""Parts whose ``__init__`` is their face: other parts import that, never a submodule."""


def test_the_parts_with_a_face_are_used_only_through_it(imports: list[Import]) -> None:
    """Above the broker, nothing imports ``tidelog.log``; and no part imports a submodule of
    another part that has a face (:data:`FACES`)."""
    wrong = [
        i.where()
        for i in imports
        if (part_of(i.module) in ("api", "sites", "control") and part_of(i.target) == "log")
        or (
            part_of(i.target) in FACES
            and part_of(i.target) != part_of(i.module)
            and i.target != f"tidelog.{part_of(i.target)}"
        )
    ]
    assert not wrong, "imports of a submodule behind a face:\n" + "\n".join(wrong)


FRONT_MODULES_EXEMPT = {
    "tidelog.api.server": "the composition root: it builds the control, the one place that "
    "knows which mode the server runs in",
    "tidelog.api.settings": "the server's settings, which include the cluster's",
}


def test_no_front_names_the_cluster(imports: list[Import]) -> None:
    """A front (every api module but the composition root) talks to the control only: it never
    imports the cluster nor keeps a ``self.cluster`` to ask which mode it is in."""
    wrong = [
        i.where()
        for i in imports
        if part_of(i.module) == "api"
        and i.module not in FRONT_MODULES_EXEMPT
        and part_of(i.target) == "cluster"
    ]
    for path in sorted((SRC / "tidelog" / "api").glob("*.py")):
        module = module_name(path, SRC)
        if module in FRONT_MODULES_EXEMPT:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "self.cluster" in line:
                wrong.append(f"{module} (line {number}) names self.cluster")
    assert not wrong, "fronts that name the cluster:\n" + "\n".join(wrong)


def test_the_cli_loads_the_server_only_late(imports: list[Import]) -> None:
    """A client command loads the client and ``tidelog.wire``, never the server's parts (nor
    numpy and RocksDB through them) or the console's web stack: the CLI imports those inside
    ``tidelog serve`` and ``tidelog console`` only (``tests/cli/test_cli_imports.py`` checks what
    a publish loads)."""
    heavy = {"api", "console", "broker", "cluster", "sites", "log", "store"}
    wrong = [
        i.where()
        for i in imports
        if part_of(i.module) == "cli"
        and part_of(i.target) in heavy
        and not (i.late or i.typing_only)
    ]
    assert not wrong, "the CLI imports these at start-up:\n" + "\n".join(wrong)


def test_no_import_cycle(imports: list[Import]) -> None:
    graph: dict[str, set[str]] = {}
    for i in imports:
        if not i.typing_only and i.target != i.module:
            graph.setdefault(i.module, set()).add(i.target)
    cycle = find_cycle({m: {t for t in ts if t != m} for m, ts in graph.items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_late_import_of_a_tidelog_module(imports: list[Import]) -> None:
    late = [
        i.where() for i in imports if i.late and (i.module, i.target) not in LATE_IMPORTS_ALLOWED
    ]
    assert not late, "imports inside functions (move them up, or break the cycle):\n" + "\n".join(
        late
    )


# -- the checker itself --------------------------------------------------------------------------


def test_the_cycle_finder_finds_a_cycle_and_only_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_imports_resolve() -> None:
    assert resolve_from("tidelog.broker.views", False, 1, "partition") == "tidelog.broker.partition"
    assert resolve_from("tidelog.broker", True, 1, "stream") == "tidelog.broker.stream"
    assert resolve_from("tidelog.broker.views", False, 2, "log") == "tidelog.log"
    assert resolve_from("tidelog.api.v1", False, 0, "tidelog.errors") == "tidelog.errors"


def test_the_collector_sees_late_typing_and_aliased_imports(tmp_path: Path) -> None:
    package = tmp_path / "tidelog"
    (package / "api").mkdir(parents=True)
    (package / "log").mkdir()
    (package / "__init__.py").write_text("")
    (package / "log" / "__init__.py").write_text("")
    (package / "api" / "__init__.py").write_text("")
    (package / "api" / "x.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from tidelog import log\n"
        "if TYPE_CHECKING:\n"
        "    import tidelog.log\n"
        "def f():\n"
        "    from ..log import thing\n"
    )
    found = {(i.target, i.late, i.typing_only) for i in collect(tmp_path)}
    assert found == {
        ("tidelog.log", False, False),
        ("tidelog.log", False, True),
        ("tidelog.log", True, False),
    }


CLASS_LINES_MAX = 400
"""The most lines a hand-written class may span: a class every change lands in is split by
concern before it grows (``docs/architecture.md``)."""


def test_no_hand_written_class_is_over_the_limit() -> None:
    too_long = []
    for path in sorted((SRC / "tidelog").rglob("*.py")):
        if "_proto" in path.parts:  # generated
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > CLASS_LINES_MAX:
                    too_long.append(f"{module_name(path, SRC)}.{node.name}: {lines} lines")
    assert not too_long, f"classes over {CLASS_LINES_MAX} lines:\n" + "\n".join(too_long)
