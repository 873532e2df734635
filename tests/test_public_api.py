"""sira_core's documented public API: every listed name resolves, and the docstring's example runs."""

import subprocess
import sys

import sira.core


def test_every_public_name_resolves_and_the_example_runs():
    assert sira.core.__all__ and all(getattr(sira_core, name) is not None for name in sira.core.__all__)
    searcher = sira.core.build_searcher([("d1", "Aspirin", "Aspirin lowers fever."),
                                         ("d2", "Coffee", "Coffee wakes you up.")], sira.core.get_preset("sira"))
    assert [h.doc_id for h in searcher.search("fever", k=10)] == ["d1"]


def test_importing_the_core_loads_no_engine():
    code = "import sys, sira.core; from sira_core import Searcher, tables; " \
           "print(sorted(m for m in ('pyspark', 'ray', 'deltalake') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
