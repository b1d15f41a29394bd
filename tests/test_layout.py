"""The package's shape, as contributors rely on it: no import cycle inside maskprior_jax (the
library core never imports the benchmarks), no function with more than 10 parameters (settings
travel as one object), no function over 70 lines of code and no module over 500 lines, a training
loop that reads on one screen, and a thin command line."""
import ast
import pathlib

import maskprior_jax

ROOT = pathlib.Path(maskprior_jax.__file__).parent


def _modules():
  for path in sorted(ROOT.rglob("*.py")):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    yield name, path, ast.parse(path.read_text())


def _imports(name: str, tree: ast.AST, known: set[str]) -> set[str]:
  """maskprior_jax modules imported anywhere in the module (top level or inside functions), except
  under `if TYPE_CHECKING:` (annotations only, never run)."""
  out = set()
  skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
          for n in ast.walk(node)}
  for node in ast.walk(tree):
    if id(node) in skip:
      continue
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out.add(node.module)
      out |= {f"{node.module}.{a.name}" for a in node.names}
  return {m for m in out if m in known and m != name}


def test_no_import_cycle_inside_the_package_and_the_core_never_imports_the_benchmarks():
  mods = {name: tree for name, _, tree in _modules()}
  graph = {name: _imports(name, tree, set(mods)) - {"maskprior_jax"} for name, tree in mods.items()}
  state = {}

  def visit(node, stack):
    state[node] = "open"
    for nxt in graph[node]:
      if state.get(nxt) == "open":
        raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
      if nxt not in state:
        visit(nxt, stack + [nxt])
    state[node] = "done"
  for name in graph:
    if name not in state:
      visit(name, [name])
  core = [n for n in graph if not n.startswith("maskprior_jax.bench")]
  assert not any(m.startswith("maskprior_jax.bench") for n in core for m in graph[n])


# Drop-in modules keep the constructor of the Flax module they replace, keyword for keyword.
DROP_IN = {"maskprior_jax.nnx.__init__"}


def test_no_function_takes_more_than_ten_parameters():
  wide = []
  for name, _, tree in _modules():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]
        params += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
        if len(params) > 10 and f"{name}.{node.name}" not in DROP_IN:
          wide.append(f"{name}.{node.name} ({len(params)})")
  assert not wide, wide


def _code_lines(lines: list[str], node) -> int:
  """A function's lines of code: its docstring, blank lines and comment lines aside."""
  body = node.body
  doc = (body[0].lineno, body[0].end_lineno) if (body and isinstance(body[0], ast.Expr)
                                                  and isinstance(body[0].value, ast.Constant)
                                                  and isinstance(body[0].value.value, str)) else (0, -1)
  return sum(1 for i in range(node.lineno, node.end_lineno + 1)
             if not doc[0] <= i <= doc[1] and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#"))


def _function_lengths():
  for name, path, tree in _modules():
    lines = path.read_text().splitlines()
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        yield f"{name}.{node.name}", _code_lines(lines, node)


def test_no_function_over_70_lines_of_code_and_no_module_over_500_lines():
  long_functions = [(f, n) for f, n in _function_lengths() if n > 70]
  long_modules = [(str(path.relative_to(ROOT)), n) for _, path, _ in _modules()
                  if (n := len(path.read_text().splitlines())) > 500]
  assert not long_functions and not long_modules, (long_functions, long_modules)


def test_the_training_loop_reads_on_one_screen():
  """train_seeds is the loop alone (resume, step, log, evaluate, checkpoint, stop): the placement is
  decided, and its stepper built, before it."""
  lengths = dict(_function_lengths())
  assert lengths["maskprior_jax.train.loop.train_seeds"] <= 60
  tree = ast.parse((ROOT / "train" / "loop.py").read_text())
  fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train_seeds")
  loop = "\n".join(ast.unparse(n) for n in fn.body[1:])   # the code, its docstring aside
  assert not any(word in loop for word in ("run_block", ".mode", "is_runs_mesh", "DeviceBatches(")), \
      "the loop asks which placement or batches it has"


def test_the_command_line_module_stays_thin():
  assert len((ROOT / "bench" / "cli.py").read_text().splitlines()) <= 205


def test_every_builtin_config_holds_every_loop_key_and_builds_its_loop_settings():
  from maskprior_jax.bench import config

  def keys(c, prefix=""):
    return {k2 for k, v in c.items() for k2 in (keys(v, f"{prefix}{k}.") if hasattr(v, "items") else [prefix + k])}
  base = keys(config.base_config())
  for name in ("boolean", "boolean_paper", "arithmetic", "vision", "language"):
    cfg = config.builtin_config(name)
    assert base <= keys(cfg), (name, base - keys(cfg))
    settings = config.loop_settings(cfg)
    assert (settings.steps, settings.batch_size, settings.eval_every) == (
        cfg.train.steps, cfg.train.batch_size, cfg.eval.every_steps)
