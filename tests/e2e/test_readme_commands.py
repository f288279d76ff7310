"""The commands and links of README.md and docs/ still point at things that exist.

Every fenced ```bash / ```sh / ```shell / ```console block is split into shell commands (line
continuations joined; `&&`, `;`, `|`, `&` chains split; leading `VAR=value` assignments and `do`,
`then`, `time` dropped). For each `python -m MODULE ...` (or `python3`) the module must resolve
(`importlib.util.find_spec`, which imports only the parent packages, all light here) and, for this
repository's modules, every `--flag` must appear in the module's source (`"--flag"`, absl's
`DEFINE_*("flag"`); `--config.a.b=v` (also inside `--override=...`) must name a field of
`config_lib.base_config()` and `--config FILE[:arg]` an existing experiment file. `python
path/to/script.py` must name an existing script, its flags checked the same way, and
`pip install -e '.[extra]'` an extra of pyproject.toml. Every relative link or image in these
files must point at an existing file (and an existing heading, for `file.md#anchor`).

Nothing is run: the checks read files and take well under a second.
"""

import glob
import importlib.util
import os
import re
import shlex
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHELL_LANGS = {"bash", "sh", "shell", "console"}
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
SHELL_WORDS = {"do", "then", "else", "time", "exec", "!", "{"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def doc_files() -> list[str]:
  """README.md and every Markdown page under docs/ (repository-relative paths)."""
  docs = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
  return ["README.md"] + [os.path.relpath(p, ROOT) for p in docs]


def shell_lines(text: str) -> list[tuple[int, str]]:
  """(line number, logical line) for each line of the shell code blocks of a Markdown text, with
  `\\` continuations joined and `$ ` prompts of console blocks stripped (console lines without a
  prompt are output and left out)."""
  out, lang, pending, pending_line = [], None, "", 0
  for number, line in enumerate(text.split("\n"), 1):
    fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
    if fence:
      if lang is None:
        lang = fence.group(2).lower() or "-"
      else:
        lang, pending = None, ""
      continue
    if lang not in SHELL_LANGS:
      continue
    if not pending:
      pending_line = number
      if lang == "console":
        if not line.lstrip().startswith("$ "):
          continue
        line = line.lstrip()[2:]
    if line.rstrip().endswith("\\"):
      pending += line.rstrip()[:-1] + " "
      continue
    out.append((pending_line, pending + line))
    pending = ""
  return out


def commands(line: str) -> list[list[str]]:
  """The simple commands of one shell line, each as its words (quotes removed, comments dropped,
  leading assignments and shell keywords dropped)."""
  lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  lexer.commenters = "#"
  try:
    words = list(lexer)
  except ValueError as e:  # an unbalanced quote
    return [["<unparsable>", str(e)]]
  result, current = [], []
  for word in [*words, ";"]:
    if word in SEPARATORS or set(word) <= set("&|;()<>"):
      if current:
        result.append(current)
      current = []
      continue
    if not current and (word in SHELL_WORDS or ASSIGNMENT.match(word)):
      continue
    current.append(word)
  return result


def flag_name(word: str) -> str:
  return word.split("=", 1)[0]


def source_has_flag(source: str, flag: str) -> bool:
  """Whether `--flag` is declared in a module's source: argparse (`"--flag"`), absl
  (`DEFINE_*("flag"`), absl's `--noflag` for a bool, argparse's `--no-flag` (BooleanOptionalAction)."""
  name = flag[2:]
  candidates = [name]
  if name.startswith("no-"):
    candidates.append(name[3:])
  if name.startswith("no") and not name.startswith("no-"):
    candidates.append(name[2:])
  for n in candidates:
    if re.search(r"""["']--""" + re.escape(n) + r"""["']""", source):
      return True
    if re.search(r"""DEFINE_\w*\(\s*["']""" + re.escape(n) + r"""["']""", source):
      return True
  return False


def config_field_problem(path: str) -> str | None:
  """None if `path` (e.g. `optim.lr`) is a field of `config_lib.base_config()`, else why not."""
  from cbert_jax import config_lib  # ml_collections only: no JAX

  node = config_lib.base_config()
  walked = []
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node.keys():
      where = ".".join(walked) or "the top level"
      return f"config field {path!r} does not exist ({part!r} is not a field of {where})"
    node = node[part]
    walked.append(part)
  return None


def module_source(module: str) -> tuple[str | None, str | None]:
  """(source path or None, problem or None) for a `python -m` module."""
  try:
    spec = importlib.util.find_spec(module)
  except (ImportError, ValueError) as e:
    return None, f"module {module!r} cannot be resolved ({type(e).__name__}: {e})"
  if spec is None:
    return None, f"module {module!r} does not exist"
  origin = spec.origin
  if spec.submodule_search_locations:  # a package: `python -m pkg` runs pkg/__main__.py
    mains = [os.path.join(d, "__main__.py") for d in spec.submodule_search_locations]
    mains = [m for m in mains if os.path.exists(m)]
    if not mains:
      return None, f"package {module!r} has no __main__.py, so `python -m {module}` cannot run"
    origin = mains[0]
  return origin, None


def pyproject_extras() -> set[str]:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return set(tomllib.load(f)["project"].get("optional-dependencies", {}))


def python_command_problems(words: list[str]) -> list[str]:
  """What is wrong with one `python ...` command (empty when nothing is)."""
  args = words[1:]
  while args and (args[0] in ("-u", "-O", "-B", "-X") or args[0].startswith("-W")):
    args = args[2:] if args[0] in ("-X", "-W") else args[1:]
  if not args or args[0] in ("-c", "-"):
    return []
  if args[0] == "-m":
    if len(args) < 2:
      return ["`python -m` without a module"]
    module, rest = args[1], args[2:]
    path, problem = module_source(module)
    if problem:
      return [problem]
    if not os.path.abspath(path).startswith(ROOT + os.sep):
      return []  # pip, venv, pytest: not ours, so their flags are not checked
  else:
    script, rest = args[0], args[1:]
    if not script.endswith(".py"):
      return []
    path = os.path.join(ROOT, script)
    if not os.path.isfile(path):
      return [f"script {script!r} does not exist"]
    module = script
  with open(path, encoding="utf-8") as f:
    source = f.read()
  # --config.FIELD=VALUE: ml_collections' config flag (the data CLIs) or config_lib.override (main)
  has_config_file = bool(
    re.search(r"""DEFINE_config_file\(\s*["']config["']|config_lib\.override\(""", source)
  )
  problems = []
  for i, word in enumerate(rest):
    if not word.startswith("--") or word == "--":
      continue
    name = flag_name(word)
    if has_config_file and name.startswith("--config."):
      problem = config_field_problem(name[len("--config.") :])
      if problem:
        problems.append(f"{word}: {problem}")
      continue
    if not source_has_flag(source, name):
      problems.append(f"flag {name} is not defined in {os.path.relpath(path, ROOT)}")
      continue
    value = word.split("=", 1)[1] if "=" in word else (rest[i + 1] if i + 1 < len(rest) else "")
    if name == "--override" and value.startswith("--config."):
      problem = config_field_problem(flag_name(value)[len("--config.") :])
      if problem:
        problems.append(f"{word}: {problem}")
    if name == "--config" and re.match(r"[^:]+\.py(:|$)", value):
      experiment = value.split(":", 1)[0]
      if not os.path.isfile(os.path.join(ROOT, experiment)):
        problems.append(f"--config {value}: no experiment file {experiment!r}")
  return problems


def pip_command_problems(words: list[str]) -> list[str]:
  """`pip install -e '.[a,b]'`: the extras must exist in pyproject.toml."""
  problems = []
  for word in words[2:]:
    m = re.fullmatch(r"\.\[([\w,\s-]+)\]", word)
    if m:
      for extra in (e.strip() for e in m.group(1).split(",")):
        if extra not in pyproject_extras():
          problems.append(f"pyproject.toml has no extra {extra!r}")
  return problems


def command_problems(words: list[str]) -> list[str]:
  if words[0] == "<unparsable>":
    return [f"cannot split the line into words ({words[1]})"]
  program = os.path.basename(words[0])
  if re.fullmatch(r"python(3(\.\d+)?)?", program):
    if words[1:3] == ["-m", "pip"] and len(words) > 3 and words[3] == "install":
      return pip_command_problems(words[2:])
    return python_command_problems(words)
  if program in ("pip", "pip3") and len(words) > 1 and words[1] == "install":
    return pip_command_problems(words)
  return []


def all_command_problems() -> tuple[list[str], int]:
  """(problems as 'file:line: command: problem', number of python commands checked)."""
  problems, checked = [], 0
  for doc in doc_files():
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
      text = f.read()
    for number, line in shell_lines(text):
      for words in commands(line):
        if re.fullmatch(r"python(3(\.\d+)?)?", os.path.basename(words[0])):
          checked += 1
        for problem in command_problems(words):
          problems.append(f"{doc}:{number}: `{' '.join(words)}`: {problem}")
  return problems, checked


def test_every_documented_command_names_a_module_and_flags_that_exist():
  problems, checked = all_command_problems()
  assert not problems, "stale commands in the docs:\n" + "\n".join(problems)
  # The extractor found the README's commands (guards against it silently finding none).
  assert checked >= 20, f"only {checked} python commands found in README.md and docs/"


def test_the_readme_starts_with_the_two_commands_ci_runs():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    lines = [line for _, line in shell_lines(f.read())]
  assert lines[0].endswith(
    "python -m cbert_jax.main --config experiments/smoke.py --workdir runs/smoke"
  ), lines[0]
  assert lines[1].endswith("python -m pytest -q -n 2 tests"), lines[1]
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    assert "python -m pytest -q -n 2 tests" in f.read().split("\n")


def test_every_cited_test_exists():
  """The docs cite the test that checks a behaviour as `test_x.py::test_name`: it must exist."""
  cited = 0
  problems = []
  # Test files are cited by name (`test_cli.py::...`); each name is unique under tests/.
  where = {}
  for directory, _, files in os.walk(os.path.join(ROOT, "tests")):
    for f in files:
      if f.startswith("test_") and f.endswith(".py"):
        assert f not in where, f"two test files named {f}: {where[f]}, {directory}"
        where[f] = os.path.join(directory, f)
  for doc in doc_files():
    with open(doc) as f:
      text = f.read()
    for number, line in enumerate(text.splitlines(), start=1):
      for path, name in re.findall(r"(test_[A-Za-z0-9_]+\.py)::([A-Za-z0-9_]+)", line):
        cited += 1
        source = where.get(path)
        if source is None:
          problems.append(f"{os.path.relpath(doc, ROOT)}:{number}: no {path} under tests/")
          continue
        with open(source) as f:
          if not re.search(rf"^def {name}\b", f.read(), re.M):
            problems.append(
              f"{os.path.relpath(doc, ROOT)}:{number}: no {name} in {os.path.relpath(source, ROOT)}"
            )
  assert cited >= 20, cited
  assert not problems, "\n".join(problems)


def github_anchor(heading: str) -> str:
  """The anchor GitHub gives a Markdown heading."""
  text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
  with open(path, encoding="utf-8") as f:
    text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
  return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def link_problems(doc: str) -> list[str]:
  """Relative links and images of one Markdown file that do not resolve."""
  path = os.path.join(ROOT, doc)
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  problems, in_fence = [], False
  for number, line in enumerate(lines, 1):
    if re.match(r"^\s*(```|~~~)", line):
      in_fence = not in_fence
      continue
    if in_fence:
      continue
    plain = re.sub(r"`[^`]*`", "", line)
    targets = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", plain)
    targets += re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", plain)
    targets += re.findall(r"<img[^>]*\ssrc=[\"']([^\"']+)[\"']", plain)
    for target in targets:
      if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
        continue
      file_part, _, anchor = target.partition("#")
      resolved = (
        os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
      )
      if not os.path.exists(resolved):
        problems.append(
          f"{doc}:{number}: link {target!r}: no file {os.path.relpath(resolved, ROOT)}"
        )
      elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
        problems.append(
          f"{doc}:{number}: link {target!r}: no heading with anchor #{anchor} in "
          f"{os.path.relpath(resolved, ROOT)}"
        )
  return problems


def test_every_relative_link_and_image_resolves():
  problems = [p for doc in doc_files() for p in link_problems(doc)]
  assert not problems, "broken links in the docs:\n" + "\n".join(problems)


@pytest.mark.parametrize(
  "block, expected",
  [
    (
      "```bash\nXLA_FLAGS=--x=2 python3 -m a.b --c=1 \\\n    --d 2 && python -m e   # comment --z\n```",
      [["python3", "-m", "a.b", "--c=1", "--d", "2"], ["python", "-m", "e"]],
    ),
    (
      "```sh\nfor i in 0 1; do python -m m --p=$i & done; wait\n```",
      [["for", "i", "in", "0", "1"], ["python", "-m", "m", "--p=$i"], ["done"], ["wait"]],
    ),
    ("```console\n$ python -m x --y\noutput --not-a-flag\n```", [["python", "-m", "x", "--y"]]),
    ("```\npython -m not.shell\n```\n```python\nimport os\n```", []),
  ],
)
def test_the_extractor_splits_chains_continuations_and_assignments(block, expected):
  found = [words for _, line in shell_lines(block) for words in commands(line)]
  assert found == expected


def test_a_stale_module_flag_or_field_is_reported():
  assert command_problems(["python", "-m", "cbert_jax.no_such_module"])
  assert command_problems(["python", "-m", "cbert_jax.main", "--no_such_flag=1"])
  assert command_problems(["python", "-m", "cbert_jax.main", "--config.optim.no_such_field=1"])
  assert command_problems(["python", "-m", "cbert_jax.main", "--config", "experiments/nope.py"])
  assert command_problems(["python", "-m", "launch.sweep", "--override=--config.nope=1"])
  assert command_problems(["pip", "install", "-e", ".[no_such_extra]"])
  assert not command_problems(
    [
      "python",
      "-m",
      "cbert_jax.main",
      "--config",
      "experiments/smoke.py:model=bert",
      "--config.optim.lr=1e-3",
      "--workdir",
      "runs/x",
    ]
  )
