"""The package's shape, as contributors rely on it: no import cycle inside maskprior_jax (the
library core never imports the benchmarks), no function with more than 10 parameters (settings
travel as one object), and a thin command line."""
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


def test_the_command_line_module_stays_thin():
  assert len((ROOT / "bench" / "cli.py").read_text().splitlines()) <= 200


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
