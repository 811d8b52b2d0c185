"""What the checks of Hugging Face exports share (hf_export_check.py,
hf_keys_check.py): the bound on log-probabilities, printing and counting
checks, importing an export's modeling code, and the exit status.

Imported from the checks' own directory (sys.path[0] when they run as
scripts); it imports neither torch nor transformers, so each check hides
transformers (or not) before anything else loads it.
"""
import importlib.util
import os
import sys

RTOL = 1e-5  # an export's fp32 log-probabilities vs `attnres score`: |a - b| <= RTOL max(1, |b|)
failures = []


def check(ok, what):
    """Prints one check's result; a failure is remembered for finish()."""
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def load_module(directory, tag):
    """modeling_attnres of one export, imported from that directory."""
    spec = importlib.util.spec_from_file_location(f"modeling_attnres_{tag}",
                                                  os.path.join(directory, "modeling_attnres.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def finish(passed):
    """Exits 1 when a check failed; prints `passed` otherwise."""
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print(passed)
