"""The import graph of the project's own modules (polykv/ and app/): no cycles, and the layering holds.

Every module is parsed with `ast` (nothing is imported). An edge A -> B means A imports B somewhere,
at the top or inside a function (a lazy import still ties the two together). For `from X import Y` the
edge goes to X, and to X.Y as well when X.Y is a module of the project; relative imports are resolved
against the importing module's package. Only modules under polykv/ and app/ are nodes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("polykv", "app")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import ...` written in `module`."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name` if it is a project module, else its longest prefix that is one (an attribute of a module)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(name, is_package, node.level, node.module)
                targets = [source, *(f"{source}.{alias.name}" for alias in node.names if alias.name != "*")]
            for target in targets:
                if target.split(".")[0] not in PACKAGES:
                    continue
                found = _known(target, modules)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative depth-first search, nodes in sorted order)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        colour[start] = GREY
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = BLACK
                stack.pop()
            elif colour[nxt] == GREY:
                return path[path.index(nxt) :] + [nxt]
            elif colour[nxt] == WHITE:
                colour[nxt] = GREY
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def _imports_of(graph: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    """{module under `prefix`: the modules it imports}."""
    return {m: deps for m, deps in graph.items() if m == prefix or m.startswith(prefix + ".")}


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


GRAPH = import_graph()


def test_the_graph_sees_the_project():
    assert {"polykv.plan", "polykv.methods", "polykv.routing", "polykv.cli", "app.common"} <= set(GRAPH)
    assert "polykv.plan" in GRAPH["polykv.methods"]  # a top-level import
    assert "polykv.eval.running.suite_runner" in GRAPH["polykv.jobs.spec"]  # one made inside a function
    assert "polykv.models.llama2c" in GRAPH["polykv.models"]  # a relative one


def test_find_cycle_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        (
            "polykv.methods",
            ("polykv.runtime", "polykv.eval", "polykv.profile", "polykv.routing", "polykv.jobs", "polykv.cli"),
        ),
        ("polykv.profile", ("polykv.routing",)),
        ("polykv", ("app",)),
    ],
)
def test_layers_do_not_import_upward(layer, forbidden):
    bad = sorted(f"{m} -> {d}" for m, deps in _imports_of(GRAPH, layer).items() for d in deps if _under(d, forbidden))
    assert not bad, f"{layer} must not import {', '.join(forbidden)}: " + "; ".join(bad)


# ---- the floors of CONTRIBUTING.md's map of the house ---------------------------------------------------
def floors(text: str) -> dict[str, float]:
    """{component: floor} from the map's table rows `| <floor> | `a`, `b` | ... |`; a sub-floor such as 8.3 lies
    between floors 8 and 9 (the rooms of polykv.eval)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        row = re.match(r"\|\s*(\d+(?:\.\d+)?)\s*\|([^|]*)\|", line)
        if row:
            for name in re.findall(r"`([\w.]+)`", row.group(2)):
                found[name] = float(row.group(1))
    return found


FLOORS = floors((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))


def component(module: str, floors_of: dict[str, float]) -> str | None:
    """The longest component of the map that `module` is or lies in."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in floors_of:
            return ".".join(parts[:n])
    return None


def arrows_against_the_floors(graph: dict[str, set[str]], floors_of: dict[str, float]) -> list[str]:
    """Every import from one component to another on the same or a higher floor."""
    bad = []
    for module, deps in sorted(graph.items()):
        source = component(module, floors_of)
        for dep in sorted(deps):
            target = component(dep, floors_of)
            if source != target and floors_of[target] >= floors_of[source]:
                up = "up" if floors_of[target] > floors_of[source] else "sideways"
                bad.append(f"{module} (floor {floors_of[source]:g}) -> {dep} (floor {floors_of[target]:g}, {up})")
    return bad


def test_the_map_places_every_module_on_a_floor():
    assert FLOORS["app"] > FLOORS["polykv.cli"] > FLOORS["polykv.jobs"] > FLOORS["polykv.eval"] > FLOORS["polykv"]
    assert not [m for m in GRAPH if component(m, FLOORS) is None]


def test_every_import_points_down_the_floors():
    bad = arrows_against_the_floors(GRAPH, FLOORS)
    assert not bad, "imports against CONTRIBUTING.md's floors: " + "; ".join(bad)


def test_an_upward_import_is_caught():
    # what the rule sees when eval reaches up for jobs (the circle the jobs package removed), or plan for methods
    graph = {
        **GRAPH,
        "polykv.eval.running.suite_runner": GRAPH["polykv.eval.running.suite_runner"] | {"polykv.jobs.spec"},
    }
    graph["polykv.plan"] = GRAPH["polykv.plan"] | {"polykv.methods.attention.h2o"}
    assert arrows_against_the_floors(graph, FLOORS) == [
        "polykv.eval.running.suite_runner (floor 8.3) -> polykv.jobs.spec (floor 10, up)",
        "polykv.plan (floor 2) -> polykv.methods.attention.h2o (floor 3, up)",
    ]
    sideways = {**GRAPH, "polykv.models": GRAPH["polykv.models"] | {"polykv.workspace"}}
    assert arrows_against_the_floors(sideways, FLOORS) == [
        "polykv.models (floor 2) -> polykv.workspace (floor 2, sideways)"
    ]


def test_the_rooms_of_eval_and_search_have_their_own_floors():
    # statistics sit below everything that states a verdict; the study and the searches above what they run
    assert FLOORS["polykv.eval"] < FLOORS["polykv.eval.statistics"] < FLOORS["polykv.eval.comparing"]
    assert FLOORS["polykv.eval.running"] < FLOORS["polykv.eval.experiments"] < FLOORS["polykv.eval.study"] < 9
    assert FLOORS["polykv.search"] < FLOORS["polykv.search.text"] < FLOORS["polykv.search.workload"] < 10
    graph = {
        **GRAPH,
        "polykv.eval.statistics.samples": GRAPH["polykv.eval.statistics.samples"] | {"polykv.eval.study.run"},
    }
    graph["polykv.search.text.report"] = GRAPH["polykv.search.text.report"] | {"polykv.search.workload.run"}
    assert arrows_against_the_floors(graph, FLOORS) == [
        "polykv.eval.statistics.samples (floor 8.1) -> polykv.eval.study.run (floor 8.7, up)",
        "polykv.search.text.report (floor 9.1) -> polykv.search.workload.run (floor 9.2, up)",
    ]


def test_no_folder_holds_more_than_fifteen_modules_and_no_file_more_than_400_lines():
    """The house's limits (CONTRIBUTING.md): a folder of polykv/ holds at most 15 modules at its top level
    (its __init__.py counted), and no file of polykv/ or app/ is over 400 lines."""
    crowded = {
        str(folder.relative_to(ROOT)): n
        for folder in [ROOT / "polykv", *(p for p in (ROOT / "polykv").rglob("*") if p.is_dir())]
        if (n := len(list(folder.glob("*.py")))) > 15
    }
    assert not crowded, crowded
    long = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400
    }
    assert not long, long


def test_plan_imports_only_errors_files_and_text():
    plan = _imports_of(GRAPH, "polykv.plan")  # the package and its modules
    outside = {d for deps in plan.values() for d in deps if not _under(d, ("polykv.plan",))}
    assert outside <= {"polykv.errors", "polykv.files", "polykv.text"}, sorted(outside)


def test_the_results_databases_file_name_is_written_once():
    # every other module asks polykv.workspace (results_path, RESULTS_FILE) where a folder keeps its runs
    written = [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "polykv" / "workspace.py"
        and any(
            isinstance(node, ast.Constant) and node.value == "results.sqlite"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    ]
    assert written == []


def test_no_private_name_is_imported_from_another_package():
    # a name starting with _ belongs to its package: another one asks for a public name (modules of one package,
    # as the rooms of polykv.eval.suites.ruler, may share theirs)
    modules = _modules()
    crossing = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        home = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _known(_resolve(name, is_package, node.level, node.module), modules) or ""
            source_home = source if modules.get(source, Path()).name == "__init__.py" else source.rpartition(".")[0]
            crossing += [
                f"{name} imports {source}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__") and source_home != home
            ]
    assert crossing == []
