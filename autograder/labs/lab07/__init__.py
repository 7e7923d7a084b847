"""Lab 07's tests: what each test cell checks, written once for its visible and its hidden cell.

Every check compares your results with the lab's formulas written out in plain numpy (in these files) or with
stored golden tokens, never with the course's own code, and each runs with the answer key forbidden
(``miniengine.layers.quant``, ``miniengine.gqa.mean_pool_kv`` and lecture 7's ``fake_quant``: a call to any of them,
under any name, fails the test). Your results are turned into plain numbers before they are compared.

Task 1, ``pack_int4`` and ``unpack_int4`` (lab07/pack.py): on every pair of codes, every byte, several shapes and
integer dtypes, each byte must be ``(q[2i] & 0xF) | (q[2i+1] & 0xF) << 4`` and each code the sign-extended nibble;
neither function may change its input, unpack(pack(q)) must give q back, and an odd number of codes must raise a
ValueError. A wrong byte is diagnosed: swapped nibbles, offset binary (code + 8), no sign extension.

Task 2, ``Int4GroupWise`` (lab07/scheme.py): on matrices built to trip a quantizer and on layers of the target, the
state must be ``{"packed": uint8 [out, in/2], "scale": float32 [out, in/G]}``; each scale absmax / 7 (1 for a group
of zeros), each code read from your bytes round(w / scale) in [-7, 7], dequantize code * scale within half a step of
w, and ``dequantize(state, rows=ids)`` those rows of the whole matrix. These tests lend the course's pack_int4 and
unpack_int4 under those names, so a mistake of Task 1 is not counted twice. Then the group sizes: anything but an
even integer >= 2 must raise a ValueError naming group_size and the value, a size that does not divide a layer's
inputs must raise one in quantize naming both numbers, and good sizes are kept (64 by default).

Task 3, ``mean_pool_kv`` (lab07/gqa.py): on hand-made and random projections, KV head g must be the mean of query
heads g*G .. g*G+G-1, in the weight's dtype, with the weight unchanged (a wrong pooling is diagnosed: the first head
only, interleaved groups, a sum, one mean for all); kv_heads that do not divide num_heads must raise a ValueError
naming kv_heads; gqa.convert of the target must hold the group means in every layer; and a target whose heads already
share K and V must convert to a model with the same logits.

Task 4, your engine (lab07/engine.py): LLM(quantization=Int4GroupWise(64)) must store half a byte per weight plus a
4-byte scale per 64 weights and produce the golden int4 tokens; LLM(model=gqa.convert(target, 2, pool=mean_pool_kv))
must hold a quarter of the target's KV bytes per token and produce the reference's tokens on that converted model.
The hidden test sends its tokens to the grader, which compares them outside your kernel.

A verdict never rests on this kernel's word (autograder/notebook_checks/ledger.py): besides its assertion, every check
``observe``s what it measured of your code (your bytes, codes, pooled weights and tokens as plain values; counts of
entries that break the format, with a bound of 0; that a bad input raised), and the grader judges those outside the
notebook, against the same observations of the course's solution. The hidden cells hold their inputs only and pass
``hidden=True``: no expected value is stated in them, the grader has the solution's.

The test cells call ``check_packer``, ``check_schemes`` (with ``special_weight`` and ``target_weight`` to build
cases), ``check_group_sizes``, ``check_pooling``, ``check_engine`` and ``report_engine``, passing your functions
and class as arguments.
"""
from __future__ import annotations

import importlib

from autograder.labs.lab07 import (common as lab07_common, engine as lab07_engine, gqa as lab07_gqa, pack as lab07_pack,  # noqa: E402
                                   scheme as lab07_scheme)

# autograder.labs.pristine reloads only this module: reload the parts here, shared helpers first, so that whatever
# an earlier cell did to any of them is undone before a test runs.
for _part in (lab07_common, lab07_pack, lab07_scheme, lab07_gqa, lab07_engine):
    importlib.reload(_part)

from autograder.labs.lab07.common import ANSWER_KEY  # noqa: E402  (after the reloads: the fresh objects)
from autograder.labs.lab07.engine import check_engine, report_engine  # noqa: E402
from autograder.labs.lab07.gqa import check_pooling  # noqa: E402
from autograder.labs.lab07.pack import check_packer  # noqa: E402
from autograder.labs.lab07.scheme import check_group_sizes, check_schemes, special_weight, target_weight  # noqa: E402

__all__ = ["ANSWER_KEY", "check_packer", "check_schemes", "special_weight", "target_weight", "check_group_sizes",
           "check_pooling", "check_engine", "report_engine"]
