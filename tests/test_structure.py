"""The package's structure rules (scripts/check_structure.py): no import cycle between modules or between
packages, no module over 500 lines, no function-level imports but of optional dependencies. The first tests
check src/zeromismatch; the rest check the checker on small synthetic packages."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "zeromismatch"


def _load_checker():
    spec = importlib.util.spec_from_file_location("check_structure", ROOT / "scripts" / "check_structure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


cs = _load_checker()


@pytest.fixture(scope="module")
def project():
    modules, imports = cs.collect_imports(PACKAGE)
    return modules, imports, cs.import_graph(modules, imports)


# ------------------------------------------------------------------------------------- src/zeromismatch


def test_no_import_cycle_between_modules(project):
    _, _, graph = project
    cycles = cs.find_cycles(graph)
    if cycles:
        pytest.fail(cs.describe_cycles(graph, cycles), pytrace=False)


def test_no_import_cycle_between_packages(project):
    _, _, graph = project
    packages = cs.package_graph(graph)
    cycles = cs.find_cycles(packages)
    if cycles:
        pytest.fail(cs.describe_cycles(packages, cycles, "packages"), pytrace=False)


def test_no_module_over_500_lines(project):
    modules, _, _ = project
    long = cs.long_modules(modules, 500)
    if long:
        pytest.fail(cs.describe_long_modules(long, 500), pytrace=False)


def test_function_level_imports_only_for_optional_dependencies(project):
    modules, imports, _ = project
    found = cs.function_level_imports(modules, imports)
    if found:
        pytest.fail(cs.describe_function_level_imports(found), pytrace=False)


def test_the_checker_sees_the_whole_package(project):
    modules, imports, graph = project
    assert "zeromismatch.plots.figures" in modules and "zeromismatch" in modules
    assert "zeromismatch.plots.runs" in graph["zeromismatch.plots.figures"]  # a relative import resolved


# ------------------------------------------------------------------------------------ the checker itself


def _write_package(root: Path, files: dict[str, str]) -> Path:
    """files: {"pkg/a.py": source}; every folder gets an __init__.py unless given. Returns root/pkg."""
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for folder in {p.parent for p in root.rglob("*.py")}:
        (folder / "__init__.py").touch(exist_ok=True)
    return root / "pkg"


def _check(package_dir: Path):
    modules, imports = cs.collect_imports(package_dir)
    graph = cs.import_graph(modules, imports)
    return modules, imports, graph


def test_clean_tree_passes(tmp_path):
    package = _write_package(tmp_path, {
        "pkg/a.py": "import json\nfrom .b import f\nfrom . import c\n",
        "pkg/b.py": "from .c import g\ndef f():\n    return g()\n",
        "pkg/c.py": "def g():\n    return 1\n",
        "pkg/sub/d.py": "from ..a import f\nfrom pkg.b import f as f2\n",
    })
    modules, imports, graph = _check(package)
    assert set(modules) == {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d"}
    assert set(graph["pkg.a"]) == {"pkg.b", "pkg.c"}
    assert set(graph["pkg.sub.d"]) == {"pkg.a", "pkg.b"}
    assert cs.find_cycles(graph) == []
    assert cs.find_cycles(cs.package_graph(graph)) == []
    assert cs.long_modules(modules, 500) == []
    assert cs.function_level_imports(modules, imports) == []
    assert cs.main(["--package", str(package)]) == 0


def test_cycle_is_found_and_named_with_its_imports(tmp_path):
    package = _write_package(tmp_path, {
        "pkg/a.py": "from .b import f\n",
        "pkg/b.py": "def f():\n    from .c import g\n    return g()\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "from .a import f\n",  # depends on the cycle, not part of it
    })
    _, _, graph = _check(package)
    cycles = cs.find_cycles(graph)
    assert cycles == [(["pkg.a", "pkg.b", "pkg.c"], [["pkg.a", "pkg.b", "pkg.c"]])]
    text = cs.describe_cycles(graph, cycles)
    assert "pkg.a -> pkg.b -> pkg.c -> pkg.a" in text
    assert "b.py:2: from .c import g (function-level, in f)" in text  # hidden cycles are cycles too
    assert "c.py:1: import pkg.a" in text
    assert cs.main(["--package", str(package)]) == 1


def test_cycle_through_a_package_init_and_a_self_import(tmp_path):
    package = _write_package(tmp_path, {
        "pkg/__init__.py": "from .a import f\nVERSION = 1\n",
        "pkg/a.py": "from . import VERSION\ndef f():\n    return VERSION\n",  # a name of pkg/__init__, not a module
        "pkg/e.py": "def h():\n    from . import e\n",
    })
    _, _, graph = _check(package)
    assert cs.find_cycles(graph) == [(["pkg", "pkg.a"], [["pkg", "pkg.a"]]), (["pkg.e"], [["pkg.e"]])]
    assert "pkg.e -> pkg.e" in cs.describe_cycles(graph, cs.find_cycles(graph))


def test_cycle_between_packages_without_a_module_cycle(tmp_path):
    package = _write_package(tmp_path, {
        "pkg/ops/ref.py": "from ..kernels.fast import k\n",
        "pkg/kernels/fast.py": "def k():\n    pass\n",
        "pkg/kernels/slow.py": "from ..ops.ref import k\n",
    })
    _, _, graph = _check(package)
    assert cs.find_cycles(graph) == []
    packages = cs.package_graph(graph)
    cycles = cs.find_cycles(packages)
    assert [c for c, _ in cycles] == [["pkg.kernels", "pkg.ops"]]
    text = cs.describe_cycles(packages, cycles, "packages")
    assert "pkg.kernels -> pkg.ops -> pkg.kernels" in text and "slow.py:1" in text and "ref.py:1" in text


def test_type_checking_imports_are_not_edges(tmp_path):
    package = _write_package(tmp_path, {
        "pkg/a.py": "from typing import TYPE_CHECKING\nfrom .b import f\nif TYPE_CHECKING:\n    from .b import T\n",
        "pkg/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import X\nelse:\n    import json\n"
                    "def f():\n    pass\n",
    })
    modules, imports, graph = _check(package)
    assert cs.find_cycles(graph) == []
    assert "json" in {i.target for i in imports}  # the else branch runs


def test_long_module_is_flagged(tmp_path):
    package = _write_package(tmp_path, {
        "pkg/short.py": "x = 1\n" * 500,
        "pkg/long.py": "x = 1\n" * 501,
    })
    modules, _, _ = _check(package)
    long = cs.long_modules(modules, 500)
    assert long == [(package / "long.py", 501)]
    assert "long.py: 501 lines (limit 500)" in cs.describe_long_modules(long, 500)


def test_function_level_imports_allow_only_optional_dependencies(tmp_path):
    package = _write_package(tmp_path, {
        "pkg/fast_triton.py": "import triton\n",
        "pkg/uses_fast.py": "from .fast_triton import triton\n",  # needs triton through fast_triton
        "pkg/plain.py": "X = 1\n",
        "pkg/a.py": textwrap.dedent("""\
            try:
                import vllm  # module level: not this rule's business
            except ImportError:
                vllm = None
            def ok_optional():
                import triton.language as tl
                from transformers import AutoModel
            def ok_needs_optional():
                from .uses_fast import triton
            def bad_stdlib():
                import json
            class K:
                def bad_project(self):
                    from .plain import X
            """),
    })
    modules, imports, _ = _check(package)
    assert cs.needs_optional(modules, imports) == {"pkg.fast_triton", "pkg.uses_fast"}
    found = cs.function_level_imports(modules, imports)
    assert [(i.line, i.function, i.text) for i in found] == [
        (11, "bad_stdlib", "import json"),
        (14, "K.bad_project", "from .plain import X"),
    ]
    text = cs.describe_function_level_imports(found)
    assert "a.py:14: from .plain import X (function-level, in K.bad_project)" in text
