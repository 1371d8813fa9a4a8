"""The product's shape as counted from its files: lines by kind, fault handling, and the rules of
docs/structure.md (one module for signals, exits and process 0; trainer/ free of the entry scripts'
plumbing; no import cycle; functions of at most 40 lines and 5 parameters).

  python -m benchmarks.code_shape            # the product: tracked *.py outside tests/, benchmarks/
  python -m benchmarks.code_shape --json     # the same as one JSON object

Lines of code by Python's tokenize: a line that holds a token other than a comment, a docstring or
white space. A broad catch: `except Exception` (or BaseException, or bare) and
`contextlib.suppress(Exception)`. A module in an import cycle: one that imports, directly or
through others, a product module that imports it back (imports for type checking alone count).
"""

import ast
import collections
import io
import json
import pathlib
import subprocess
import tokenize
from typing import Any

from absl import flags

from benchmarks.workload import parse_flags
from trainer.host.boundary import Host

_JSON = flags.DEFINE_bool('json', False, 'The counts as one JSON object.')

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIPPED = ('tests/', 'benchmarks/')
NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
MAX_LINES, MAX_PARAMETERS = 40, 5
# What one module each may use (call or pass on), as written in the source.
OWNED = ('signal.signal', 'os._exit', 'is_primary')


def product_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  """The tracked Python files of the product: tests and benchmarks aside."""
  listed = subprocess.run(['git', 'ls-files', '*.py'], cwd=root, capture_output=True, text=True,
                          check=True).stdout.split()
  return [root / name for name in listed if not name.startswith(SKIPPED)]


def _docstring_lines(tree: ast.Module) -> set[int]:
  """The lines of every module, class and function docstring."""
  lines: set[int] = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
          and isinstance(body[0].value.value, str):
        lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
  return lines


def line_kinds(source: str, tree: ast.Module) -> collections.Counter:
  """How many lines hold code, docstrings, comments alone."""
  docstrings = _docstring_lines(tree)
  code: set[int] = set()
  comments: set[int] = set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    rows = range(token.start[0], token.end[0] + 1)
    if token.type == tokenize.COMMENT:
      comments.update(rows)
    elif token.type not in NOT_CODE:
      code.update(row for row in rows if row not in docstrings)
  return collections.Counter(code=len(code), docstring=len(docstrings),
                             comment=len(comments - code - docstrings))


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
  args = node.args
  names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
  names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
  return len([name for name in names if name not in ('self', 'cls')])


def _is_broad(node: ast.AST) -> bool:
  """An except clause, or a contextlib.suppress call, that catches Exception or more."""
  if isinstance(node, ast.ExceptHandler):
    kind = node.type
    if kind is None:
      return True
    names = kind.elts if isinstance(kind, ast.Tuple) else [kind]
  elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith('suppress'):
    names = node.args
  else:
    return False
  return any(isinstance(n, ast.Name) and n.id in ('Exception', 'BaseException') for n in names)


def module_name(name: str) -> str:
  """A file's module: trainer/host/peers.py -> trainer.host.peers."""
  return name.removesuffix('.py').removesuffix('/__init__').replace('/', '.')


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
  """The modules an import statement names: `from a import b` names a.b and a."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  base = node.module or ''
  return [base, *(f'{base}.{alias.name}' for alias in node.names)]


def modules_in_cycles(imports: dict[str, set[str]]) -> list[str]:
  """The modules from which an import leads back to themselves (Tarjan's strongly connected
  components of more than one module, or a module importing itself)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  found: list[str] = []

  def visit(module: str) -> None:
    index[module] = low[module] = len(index)
    stack.append(module)
    for other in sorted(imports[module]):
      if other not in index:
        visit(other)
        low[module] = min(low[module], low[other])
      elif other in stack:
        low[module] = min(low[module], index[other])
    if low[module] == index[module]:
      component = stack[stack.index(module):]
      del stack[stack.index(module):]
      if len(component) > 1 or module in imports[module]:
        found.extend(sorted(component))

  for module in sorted(imports):
    if module not in index:
      visit(module)
  return sorted(found)


def shape_of(path: pathlib.Path, root: pathlib.Path = ROOT) -> dict[str, Any]:
  """One file's counts and the functions over the limits."""
  source = path.read_text(encoding='utf-8')
  tree = ast.parse(source)
  name = str(path.relative_to(root))
  found: dict[str, Any] = {'lines': line_kinds(source, tree), 'try': 0, 'broad_except': 0,
                           'long': [], 'many_parameters': [], 'calls': collections.Counter(),
                           'imports_command': False, 'imports': set()}
  for node in ast.walk(tree):
    found['broad_except'] += _is_broad(node)
    if isinstance(node, ast.Try) or type(node).__name__ == 'TryStar':
      found['try'] += 1
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      length = (node.end_lineno or node.lineno) - node.lineno + 1
      if length > MAX_LINES:
        found['long'].append(f'{name}:{node.lineno} {node.name} ({length} lines)')
      if _parameters(node) > MAX_PARAMETERS:
        found['many_parameters'].append(f'{name}:{node.lineno} {node.name} '
                                        f'({_parameters(node)} parameters)')
    elif isinstance(node, (ast.Attribute, ast.Name)):
      used = ast.unparse(node)
      for owned in OWNED:
        if used == owned or used.endswith(f'.{owned}') and '.' not in owned:
          found['calls'][owned] += 1
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      found['imports'].update(imported(node))
      found['imports_command'] |= any(m == 'command' or m.startswith('command.')
                                      for m in imported(node)[:1 if isinstance(node, ast.ImportFrom)
                                                              else None])
  return found


def shape(root: pathlib.Path = ROOT) -> dict[str, Any]:
  """The product's counts, in all and for trainer/, and where each rule is broken."""
  total: dict[str, Any] = {'lines': collections.Counter(), 'trainer_lines': collections.Counter(),
                           'try': 0, 'broad_except': 0, 'long': [], 'many_parameters': [],
                           'modules_calling': {owned: [] for owned in OWNED},
                           'trainer_importing_command': []}
  imports: dict[str, set[str]] = {}
  for path in product_files(root):
    found = shape_of(path, root)
    name = str(path.relative_to(root))
    imports[module_name(name)] = found.pop('imports')
    total['lines'] += found['lines']
    if name.startswith('trainer/'):
      total['trainer_lines'] += found['lines']
      if found['imports_command']:
        total['trainer_importing_command'].append(name)
    for key in ('try', 'broad_except', 'long', 'many_parameters'):
      total[key] += found[key]
    for owned in found['calls']:
      total['modules_calling'][owned].append(name)
  total['import_cycles'] = modules_in_cycles(
      {module: {m for m in named if m in imports and m != module.rpartition('.')[0]}
       for module, named in imports.items()})
  return total


def main(argv: list[str]) -> None:
  del argv  # parse_flags refused any.
  counted = shape()
  if _JSON.value:
    print(json.dumps(counted, indent=1))
    return
  for key in ('lines', 'trainer_lines'):
    print(f'{key}: ' + ', '.join(f'{kind} {counted[key][kind]:,}'
                                for kind in ('code', 'docstring', 'comment')))
  print(f"try statements: {counted['try']}; broad excepts: {counted['broad_except']}")
  for owned, modules in counted['modules_calling'].items():
    print(f'{owned} used in {len(modules)} modules: {", ".join(modules) or "none"}')
  print(f"trainer/ modules importing command: {counted['trainer_importing_command'] or 'none'}")
  print(f"modules in import cycles: {len(counted['import_cycles'])}"
        + ''.join(f'\n  {module}' for module in counted['import_cycles']))
  for key, limit in (('long', f'over {MAX_LINES} lines'),
                     ('many_parameters', f'over {MAX_PARAMETERS} parameters')):
    print(f'functions {limit}: {len(counted[key])}' +
          ''.join(f'\n  {item}' for item in counted[key]))


if __name__ == '__main__':
  Host().run(main, parse_flags)
