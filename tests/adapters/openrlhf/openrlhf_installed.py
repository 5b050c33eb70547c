"""Functions of the installed OpenRLHF read from its source files, without importing their modules.

``openrlhf.utils.deepspeed`` and ``openrlhf.trainer.ray.ppo_actor`` import flash-attn and vLLM, which
build only against CUDA; their signatures and return statements are read from the real files instead.
"""

from __future__ import annotations

import ast
import importlib.metadata


def method(relative_path: str, class_name: str, name: str) -> ast.FunctionDef:
    """The definition of ``class_name.name`` in the installed ``openrlhf/<relative_path>``."""
    path = importlib.metadata.distribution("openrlhf").locate_file(f"openrlhf/{relative_path}")
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise LookupError(f"{class_name}.{name} not in openrlhf/{relative_path}")


def with_signature_of(definition: ast.FunctionDef, body: str):
    """A function with ``definition``'s parameters (names and defaults) and the statements ``body``."""
    function = ast.FunctionDef(
        name=definition.name, args=definition.args, body=ast.parse(body).body, decorator_list=[], returns=None,
        type_params=[],
    )
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace: dict = {}
    exec(compile(module, f"<{definition.name}>", "exec"), namespace)
    return namespace[definition.name]
