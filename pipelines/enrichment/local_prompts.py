"""The embedded model's name and the prompt layout it adds around a template (worked examples, cue, markers).
Apart from sira.pipelines.enrichment.local_llm (which loads llama.cpp) so that a backend's config can key proposals on the layout
without importing the engine."""

from __future__ import annotations

import json

DEFAULT_LOCAL_MODEL = "gemma3-270m-q4_k_m"

# What follows the rendered prompt in the completion formats, so a base model continues with the answer.
COMPLETION_CUE = "\n\nJSON output:\n"
DOCUMENT_MARKER = "Document:\n"
# Worked examples for the `-fewshot` formats (text before the document, or earlier chat turns).
# Invented texts from two domains, so no benchmark document leaks in and no one domain's vocabulary is primed.
FEWSHOT_EXAMPLES = (
    ("Metformin and lactic acidosis in chronic kidney disease. We followed 312 patients with stage 3 chronic "
     "kidney disease who took metformin for type 2 diabetes. Plasma lactate above 5 mmol/L was rare (0.4%) and "
     "was not associated with the daily dose.",
     ["biguanide", "CKD", "renal impairment", "eGFR", "hyperlactatemia", "T2DM", "Glucophage"]),
    ("Solar panel output in hot climates. In a two-year field test in Arizona, module output fell by 0.45% for "
     "every degree Celsius above 25 degrees.",
     ["photovoltaic", "PV module", "temperature coefficient", "heat derating", "desert installation"]),
)


QUERY_MARKER = "Query:\n"
# The query side's worked examples: invented questions, answered with the vocabulary of their evidence and never
# with the answer (the yes/no question gets no verdict). Without them the base model answers a query template
# with the template's own words ("phrase", "who", "when"), measured on scifact queries.
FEWSHOT_QUERY_EXAMPLES = (
    ("Does metformin raise the risk of lactic acidosis in kidney disease?",
     ["biguanide", "hyperlactatemia", "CKD", "renal impairment", "eGFR", "plasma lactate", "T2DM"]),
    ("solar panel output in hot climates",
     ["photovoltaic", "PV module", "temperature coefficient", "heat derating", "power loss", "desert"]),
)


def layout_version() -> str:
    """A hash of what this module adds around a template (worked examples, cue): part of the cache key of local
    proposals, so changing an example re-runs the proposals it shaped instead of reusing them."""
    import hashlib

    layout = json.dumps([FEWSHOT_EXAMPLES, FEWSHOT_QUERY_EXAMPLES, COMPLETION_CUE, DOCUMENT_MARKER, QUERY_MARKER])
    return hashlib.sha256(layout.encode()).hexdigest()[:8]
