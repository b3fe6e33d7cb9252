"""The experiment layer names no method: FedPALS' keys appear in its comments and docs only.

What a method adds to a run (its report, its hyperparameters shown, its sweep axis, its grid,
its figure style) comes from its registration (`Method.monitor`, `hyperparameter(...,
shown=, axis=, label=)`, `Feature.grid`, `register_method_style`), so a user's method gets
the same treatment as FedPALS without an edit of `fedjax_pals/experiment/`.
"""

import ast
import io
import pathlib
import re
import tokenize

import fedjax_pals

EXPERIMENT = pathlib.Path(fedjax_pals.__file__).parent / "experiment"
# FedPALS' config keys and method key, as code would spell them (display names such as
# "FedPALS" in a message are prose, like the docs).
FEDPALS_KEYS = re.compile(r"\b(lam|ess_fraction)\b|fedpals")
# Deprecation shims kept until 0.4.0 (CHANGELOG.md): Task.lam and its message.
ALLOWED = {("task.py", "Task.lam")}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def _shim_lines(tree: ast.AST, path: pathlib.Path) -> set[int]:
    """The lines of the allowed deprecation shims (`Class.attribute` in ALLOWED)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, ast.FunctionDef)
                        and (path.name, f"{node.name}.{item.name}") in ALLOWED):
                    lines.update(range(item.lineno, item.end_lineno + 1))
    return lines


def fedpals_keys_in_code(directory: pathlib.Path) -> list[str]:
    """`file:line: token` for each name or string of the code (not a comment, not a
    docstring, not an allowed shim) that spells one of FedPALS' keys."""
    found = []
    for path in sorted(directory.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        skipped = _docstring_lines(tree) | _shim_lines(tree, path)
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT or token.start[0] in skipped:
                continue
            if token.type in (tokenize.NAME, tokenize.STRING) and FEDPALS_KEYS.search(token.string):
                found.append(f"{path.name}:{token.start[0]}: {token.string[:80]}")
    return found


def test_the_experiment_layer_spells_no_fedpals_key_outside_comments_and_docs():
    assert fedpals_keys_in_code(EXPERIMENT) == []


def test_the_scan_finds_a_key_in_code_but_not_in_a_comment_or_a_docstring(tmp_path):
    (tmp_path / "module.py").write_text(
        '"""FedPALS\' lam and ess_fraction, in a docstring."""\n'
        "# fedpals in a comment\n"
        "def f(config):\n"
        '    """lam again."""\n'
        '    return config["ess_fraction"], config.algorithm.lam\n'
    )
    assert fedpals_keys_in_code(tmp_path) == [
        "module.py:5: \"ess_fraction\"", "module.py:5: lam"]
