"""The tests' own layout: a test module never imports from another test module.

Code that several test modules share lives in the modules directly in tests/ that are not tests
(helpers.py, cli_helpers.py, launch_helpers.py, package_archives.py, ...), so running, moving or
deleting one test file never changes another. Read with `ast` (imports inside functions count).
"""

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_name(path: str) -> str:
  """tests/e2e/test_train.py -> tests.e2e.test_train."""
  return os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")


def is_test_module(name: str) -> bool:
  parts = name.split(".")
  return parts[0] == "tests" and parts[-1].startswith("test_")


def cross_test_imports(source: str, name: str) -> list[tuple[int, str, str]]:
  """(line, import as written, the test module imported) for each import of another test module
  in `source`, the text of module `name` (for relative imports): `from tests.x.test_y import z`,
  `from tests.x import test_y`, `import tests.x.test_y`, their relative forms, at any depth."""
  out = []
  package = name.split(".")[:-1]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module.split(".") if node.module else []
      if node.level:
        base = package[: len(package) - node.level + 1] + base
      module = ".".join(base)
      targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
    else:
      continue
    for target in targets:
      if is_test_module(target) and target != name:
        text = ast.get_source_segment(source, node) or ast.unparse(node)
        out.append((node.lineno, text, target))
        break
  return sorted(out)


def test_no_test_module_imports_another():
  paths = sorted(glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True))
  assert len(paths) > 50, paths  # the glob found the test tree
  bad = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      found = cross_test_imports(f.read(), module_name(path))
    rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
    bad += [f"{rel}:{line}: {text}" for line, text, _ in found]
  assert not bad, (
    "test modules import from other test modules; move the shared code to tests/helpers.py (or a"
    " sibling module such as tests/cli_helpers.py) and import it from there:\n  " + "\n  ".join(bad)
  )


def test_the_check_sees_every_form_of_import():
  source = (
    "import os\n"
    "from tests import helpers\n"
    "from tests.helpers import tiny_config\n"
    "from tests.e2e.test_train import TINY\n"
    "from tests.e2e import test_cli\n"
    "import tests.run.test_multiprocess as mp\n"
    "from .test_train import losses\n"
    "from ..data.test_task_kit import MAKERS\n"
    "def f():\n"
    "  from tests.test_light_imports import run_without_jax\n"
  )
  found = cross_test_imports(source, "tests.e2e.test_here")
  assert [line for line, _, _ in found] == [4, 5, 6, 7, 8, 10]
  assert found[0][1:] == ("from tests.e2e.test_train import TINY", "tests.e2e.test_train")
  assert [target for _, _, target in found[3:5]] == [
    "tests.e2e.test_train",
    "tests.data.test_task_kit",
  ]
  assert cross_test_imports("from tests.e2e.test_here import x\n", "tests.e2e.test_here") == []
