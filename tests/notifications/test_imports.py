"""The notifications room imports in one direction: tasks → delivery → services."""

import ast
import pathlib

import notifications

ROOM = pathlib.Path(notifications.__file__).parent


def imported_siblings(name: str) -> set[str]:
    """The sibling modules `name` imports anywhere in it (function-level imports included)."""
    tree = ast.parse((ROOM / f"{name}.py").read_text())
    return {
        node.module.split(".")[1]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("notifications.")
    }


def test_services_delivery_tasks_import_without_a_cycle():
    assert not {"tasks", "delivery"} & imported_siblings("services")
    assert "tasks" not in imported_siblings("delivery")
