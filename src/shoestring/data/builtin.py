"""The embedded corpus ``builtin:pydocs``: text every Python install already has.

It exists so that ``shoestring prep builtin:pydocs`` works offline, with no download: the
interactive-help topics (``pydoc_data``) plus the standard library's docstrings. The
docstrings are read from source with ``ast`` instead of importing the modules, because
importing arbitrary stdlib modules has side effects (``antigravity`` opens a browser,
``this`` prints a poem, some start threads or probe hardware), and parsing is faster anyway.
"""

from __future__ import annotations

import ast
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from shoestring.data.readers import Document

SOURCE = "builtin:pydocs"

_SKIP_DIRS = frozenset(
    {
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "__pycache__",
        "ensurepip",
    }
)

_Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def iter_pydocs() -> Iterator[Document]:
    """Help topics first, then one document per stdlib module, in a fixed order."""
    yield from _iter_topics()
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in _stdlib_files(root):
        module = _module_name(path, root)
        text = _module_text(path, module)
        if text:
            yield Document(text=text, source=SOURCE, doc_id=module)


def _iter_topics() -> Iterator[Document]:
    """Some distributions split ``pydoc_data`` out; the docstrings still make a corpus."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return
    for name in sorted(topics):
        text = topics[name].strip()
        if text:
            yield Document(text=text, source=SOURCE, doc_id=f"topics/{name}")


def _stdlib_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-")]
        found.extend(Path(folder, f) for f in files if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _module_text(path: Path, module: str) -> str:
    """Module docstring, then each definition's docstring under its qualified name.

    Files that cannot be read or parsed (a stdlib with odd encodings, newer syntax in a
    vendored file) are skipped silently: the corpus is best-effort, not a contract.
    """
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return ""
    blocks = []
    doc = ast.get_docstring(tree)
    if doc:
        blocks.append(doc)
    for qualname, member_doc in _member_docs(tree.body, module):
        blocks.append(f"{qualname}\n{member_doc}")
    return "\n\n".join(blocks)


def _member_docs(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, str]]:
    """Classes recurse into their methods; function bodies are not entered (local helpers)."""
    for node in body:
        if not isinstance(node, _Def):
            continue
        qualname = f"{prefix}.{node.name}"
        doc = ast.get_docstring(node)
        if doc:
            yield qualname, doc
        if isinstance(node, ast.ClassDef):
            yield from _member_docs(node.body, qualname)
