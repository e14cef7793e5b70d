"""Prints the API fuzzer's case count at the end of a run (docs/security.md quotes it)."""

import sys


def pytest_terminal_summary(terminalreporter):
    module = sys.modules.get("tests.security.test_api_fuzz")
    cases = getattr(module, "CASES", None)
    if cases:
        terminalreporter.write_line(f"API fuzzer: {sum(cases.values())} cases sent ({dict(cases)})")
