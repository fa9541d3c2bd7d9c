"""Fails if a lower layer of ctrtrain imports an upper one (`data` knows nothing of `train`).
Reads every module's imports with `ast` (nothing is run). Run by scripts/test.sh."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# Lowest first. A module may import its own layer and those below it.
LAYERS = [
    {"errors", "mode", "heartbeat", "progress", "metrics", "usage", "shutdown", "values",
     "kernels", "tf_start"},
    {"data"},
    {"environment"},
    {"input"},
    {"models"},
    {"train"},
    {"cluster"},
    {"launch"},
    {"recipes"},
    # Runners of training runs: benchmarks, the quick start, hyperparameter search.
    {"bench", "quickstart", "search"},
    {"api"},
    # The package's face: its version, the Keras hook, and the Python API by name (api.py,
    # whose functions import what they run when called).
    {"cli", "__init__"},
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


PKG = Path(__file__).resolve().parents[1] / "src" / "ctrtrain"


def top(parts: list[str]) -> str:
    """The top-level module or subpackage a path is in; names defined in the package's
    __init__ (e.g. __version__) belong to it."""
    if not parts or not ((PKG / parts[0]).is_dir() or (PKG / f"{parts[0]}.py").exists()):
        return "__init__"
    return parts[0]


def imported(node, module_parts: list[str]) -> list[list[str]]:
    """ctrtrain-relative paths of what an import statement brings in."""
    if isinstance(node, ast.Import):
        return [n.name.split(".")[1:] for n in node.names if n.name.split(".")[0] == "ctrtrain"]
    if isinstance(node, ast.ImportFrom):
        if node.level == 0:
            parts = (node.module or "").split(".")
            return [parts[1:]] if parts[0] == "ctrtrain" else []
        base = module_parts[:-node.level] if node.level <= len(module_parts) else []
        tail = (node.module or "").split(".") if node.module else []
        if tail:
            return [base + tail]
        return [base + [n.name] for n in node.names]
    return []


def main(root: Path) -> int:
    pkg = root / "src" / "ctrtrain"
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).with_suffix("").parts
        me = top(list(rel))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for parts in imported(node, list(rel)):
                other = top(parts)
                if other in LEVEL and me in LEVEL and LEVEL[other] > LEVEL[me]:
                    bad.append(f"{path.relative_to(root)}:{node.lineno}: {me} (layer "
                               f"{LEVEL[me]}) imports {'.'.join(parts)} (layer {LEVEL[other]})")
                elif other not in LEVEL or me not in LEVEL:
                    bad.append(f"{path.relative_to(root)}:{node.lineno}: {me} or {other} is in no "
                               "layer of scripts/check_layers.py")
    for b in bad:
        print(b)
    print(f"layers: {len(bad)} problems in {len(list(pkg.rglob('*.py')))} modules")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(__file__).resolve().parents[1]))
