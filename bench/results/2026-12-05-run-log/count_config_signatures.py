"""Function signatures in common/ that take the whole Config: python count_config_signatures.py [REPO].
Prints the count, then one line per signature: file, function, and the config sections it reads."""

import ast
import sys
from pathlib import Path

WHOLE = {"Config", "Optional[Config]", "Config | Mapping[str, Any]"}

rows = []
for path in sorted((Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "common").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                if arg.annotation is not None and ast.unparse(arg.annotation).strip("'\"") in WHOLE:
                    read = {
                        n.attr
                        for n in ast.walk(node)
                        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == arg.arg
                    }
                    rows.append(f"{path}: {node.name}({arg.arg}) reads {sorted(read) or 'it whole'}")
print(len(rows))
print("\n".join(rows))
