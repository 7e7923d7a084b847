"""Speculative decoding (milestone 6): a draft model proposes, the target verifies in one pass.

``verify.py``: the two verifiers (coupled, rejection sampling); ``proposer.py``: the draft model and its
cache; ``decoding.py``: the engine step that ties them together.  Turned on with
``LLM(speculative_model="draft", num_speculative_tokens=γ)``.
"""
