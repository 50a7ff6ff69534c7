"""Duplicates among synthesised tasks: a normalised AST hash for exact copies, AST shingles for near ones.

(KernelBench contamination is judged on the traced computation instead: tasks/synth/contamination.py.
Between tasks this composer wrote, the code is the computation, so its shape is a fair measure.)

Two programs are compared by the Jaccard similarity of their AST 3-gram shingles: the stream
of node types and names (operators, attributes, functions called), with every constant
replaced by its type and docstrings dropped. So the same chain with other sizes, comments or
hyperparameters is a near-duplicate (similarity 1.0), and a reordered or extended chain scores
lower. MinHash LSH (datasketch) finds the candidates above a threshold among thousands of
programs; the similarity reported is then computed exactly.
"""
from __future__ import annotations

import ast
import hashlib

from datasketch import MinHash, MinHashLSH

NUM_PERM = 128
SHINGLE = 3


def tokens(source: str) -> list[str]:
    """The program's AST as a token stream: node types, names and attributes; constants by type only."""
    tree = _without_docstrings(ast.parse(source))
    # The computation only (Model and get_inputs): the imports and constants every program shares
    # would make any two one-operator programs look alike.
    parts = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in ("Model", "get_inputs")]
    out = []
    for node in (child for part in (parts or [tree]) for child in ast.walk(part)):
        if isinstance(node, (ast.expr_context, ast.arguments)):
            continue  # Load/Store marks and argument lists: filler that makes every program alike
        out.append(type(node).__name__)
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, ast.Constant):
            out.append(type(node.value).__name__)
    return out


def exact_key(source: str) -> str:
    """Equal for programs that differ only in comments, docstrings and layout."""
    dump = ast.dump(_without_docstrings(ast.parse(source)), annotate_fields=False, include_attributes=False)
    return hashlib.sha256(dump.encode()).hexdigest()


def shingles(source: str) -> set[str]:
    stream = tokens(source)
    return {" ".join(stream[i:i + SHINGLE]) for i in range(max(1, len(stream) - SHINGLE + 1))}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class SimilarityIndex:
    """Programs by name, searchable for those at least ``threshold`` similar to a new one."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
        self.sets: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self.sets)

    def add(self, name: str, source: str) -> None:
        if name in self.sets:
            return
        grams = shingles(source)
        self.sets[name] = grams
        self.lsh.insert(name, _minhash(grams))

    def similar(self, source: str) -> tuple[str, float] | None:
        """The most similar program at or above the threshold, or None."""
        grams = shingles(source)
        found = [(name, jaccard(grams, self.sets[name])) for name in self.lsh.query(_minhash(grams))]
        found = [f for f in found if f[1] >= self.threshold]
        return max(found, key=lambda f: f[1]) if found else None

    def closest(self, source: str) -> tuple[str, float]:
        """The most similar program of all (exact, over every entry: for reports)."""
        grams = shingles(source)
        return max(((name, jaccard(grams, s)) for name, s in self.sets.items()), key=lambda f: f[1], default=("", 0.0))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _minhash(grams: set[str]) -> MinHash:
    m = MinHash(num_perm=NUM_PERM)
    for g in grams:
        m.update(g.encode())
    return m
