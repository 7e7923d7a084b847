"""Lab 07, Task 1: pack_int4 and unpack_int4, checked against the lab's formulas for each byte and code.
Reloaded by ``autograder.labs.lab07``, which the test cells call.

Besides its assertions, each case ``observe``s your output (autograder/notebook_checks/ledger.py) for the grader to judge
outside the notebook: your bytes and codes as plain ints, with the formula's as the expected values in a visible
case; a hidden case leaves them to the grader, who has the course's solution's."""
from __future__ import annotations

import numpy as np
import torch

import autograder.notebook_checks as checks
from autograder.labs.lab07.common import ANSWER_KEY, as_tensor, call, first, want_codes


def own_packer(pack_int4, unpack_int4):
    checks.require_own(pack_int4, "pack_int4")
    checks.require_own(unpack_int4, "unpack_int4")


def want_bytes(q):
    """The lab's packing, by the formula: byte i = (q[2i] & 0xF) | (q[2i+1] & 0xF) << 4."""
    q = np.asarray(q, dtype=np.int64)
    return (q[..., 0::2] & 0xF) | ((q[..., 1::2] & 0xF) << 4)


def ints(t, what, dtype):
    """Your tensor t as int64 numbers, once it is a tensor of the dtype the task names."""
    t = as_tensor(t, what)
    assert t.dtype == dtype, f"{what}: expected dtype {dtype}, got {t.dtype}"
    return t.detach().cpu().numpy().astype(np.int64)


def expected(want, hidden):
    """observe's keywords: the formula's value as the expected one, but not in a hidden case (the grader's)."""
    return {} if hidden else {"expect": want.tolist()}


def check_pack(pack_int4, q, dtype, label, hidden=False, case=""):
    """pack_int4 on codes q (any shape, an even last dimension) must give the bytes of the formula."""
    q = np.asarray(q, dtype=np.int64)
    qt = torch.tensor(q, dtype=dtype)
    before = qt.clone()
    what = f"{label}pack_int4 of {str(dtype)[6:]} codes of shape {list(q.shape)}"
    got = call(pack_int4, what, qt)
    assert torch.equal(qt, before), f"{what}: pack_int4 changed its input"
    got = ints(got, what, torch.uint8)
    want = want_bytes(q)
    checks.observe(f"{what}{case}: the bytes", got.tolist(), **expected(want, hidden))
    assert got.shape == want.shape, (
        f"{what}: expected shape {list(want.shape)} (two codes per byte, along the last dimension), got {list(got.shape)}")
    if not np.array_equal(got, want):
        i = first(got != want)
        a, b = int(q[i[:-1] + (2 * i[-1],)]), int(q[i[:-1] + (2 * i[-1] + 1,)])
        g, w = int(got[i]), int(want[i])
        if g == ((w & 0xF) << 4) | (w >> 4):
            raise AssertionError(
                f"{what}: the nibbles are swapped: the codes ({a}, {b}) should pack to 0x{w:02X}, got 0x{g:02X}. Code 2i "
                f"goes in the low nibble of byte i (bits 0-3), code 2i+1 in the high nibble (bits 4-7)")
        if g == (a + 8) | ((b + 8) << 4):
            raise AssertionError(
                f"{what}: you stored code + 8 (offset binary): the codes ({a}, {b}) should pack to 0x{w:02X}, got "
                f"0x{g:02X}. The lab stores each code's 4-bit two's complement pattern, code & 0xF: -1 is 0xF, -8 is 0x8")
        raise AssertionError(
            f"{what}: byte {list(i)} should hold the codes ({a}, {b}) as 0x{w:02X} (low nibble 0x{w & 0xF:X} = {a} & 0xF, "
            f"high nibble 0x{w >> 4:X} = {b} & 0xF), got 0x{g:02X}")


def check_unpack(unpack_int4, b, label, hidden=False, case=""):
    """unpack_int4 on bytes b must give the codes of the formula, as int8."""
    b = np.asarray(b, dtype=np.int64)
    bt = torch.tensor(b, dtype=torch.uint8)
    before = bt.clone()
    what = f"{label}unpack_int4 of uint8 bytes of shape {list(b.shape)}"
    got = call(unpack_int4, what, bt)
    assert torch.equal(bt, before), f"{what}: unpack_int4 changed its input"
    got = ints(got, what, torch.int8)
    want = want_codes(b)
    checks.observe(f"{what}{case}: the codes", got.tolist(), **expected(want, hidden))
    assert got.shape == want.shape, (
        f"{what}: expected shape {list(want.shape)} (two codes per byte, along the last dimension), got {list(got.shape)}")
    if not np.array_equal(got, want):
        i = first(got != want)
        k = i[-1] // 2
        byte = int(b[i[:-1] + (k,)])
        lo, hi = int(want[i[:-1] + (2 * k,)]), int(want[i[:-1] + (2 * k + 1,)])
        glo, ghi = int(got[i[:-1] + (2 * k,)]), int(got[i[:-1] + (2 * k + 1,)])
        said = f"byte 0x{byte:02X} should unpack to the codes ({lo}, {hi}), got ({glo}, {ghi})"
        if (glo, ghi) == (hi, lo):
            raise AssertionError(f"{what}: the nibbles are swapped: {said}. The low nibble (bits 0-3) is code 2i, the "
                                 f"high nibble (bits 4-7) code 2i+1")
        if (glo, ghi) == (byte & 0xF, byte >> 4):
            raise AssertionError(f"{what}: the nibbles are not sign-extended: {said}. A nibble is a 4-bit two's "
                                 f"complement number: 0x0-0x7 are 0 to 7, 0x8-0xF are -8 to -1 (nibble - 16)")
        if (glo, ghi) == ((byte & 0xF) - 8, (byte >> 4) - 8):
            raise AssertionError(f"{what}: you read the nibbles as code + 8 (offset binary): {said}. The lab stores "
                                 f"two's complement (code & 0xF)")
        raise AssertionError(f"{what}: {said} at positions {2 * k} and {2 * k + 1} (byte {list(i[:-1] + (k,))})")


def check_round_trip(pack_int4, unpack_int4, q, dtype, label, hidden=False, case=""):
    """unpack_int4 must undo pack_int4 exactly."""
    q = np.asarray(q, dtype=np.int64)
    what = f"{label}unpack_int4(pack_int4(q)) for {str(dtype)[6:]} codes of shape {list(q.shape)}"
    packed = call(pack_int4, what, torch.tensor(q, dtype=dtype))
    got = ints(call(unpack_int4, what, as_tensor(packed, what)), what, torch.int8)
    checks.observe(f"{what}{case}", got.tolist(), **expected(q, hidden))
    assert got.shape == q.shape, f"{what}: expected shape {list(q.shape)}, got {list(got.shape)}"
    if not np.array_equal(got, q):
        i = first(got != q)
        raise AssertionError(f"{what}: code {list(i)} was {int(q[i])}, and came back as {int(got[i])}")


def check_odd(pack_int4, shape, label):
    """An odd number of codes cannot be packed two to a byte: pack_int4 must raise a ValueError."""
    what = f"{label}pack_int4 of codes of shape {list(shape)}"
    try:
        pack_int4(torch.zeros(shape, dtype=torch.int8))
    except ValueError:
        checks.observe(f"{what} raises ValueError", True, expect=True)
        return
    except Exception as e:
        raise AssertionError(f"{what} raised {type(e).__name__}: {e}; an odd number of codes in the last dimension "
                             f"cannot be packed two to a byte: raise a ValueError that says so") from e
    raise AssertionError(f"{what} returned a result, but {shape[-1]} codes cannot be packed two to a byte: "
                         f"raise a ValueError")


def check_packer(pack_int4, unpack_int4, pack_cases, unpack_cases, odd_shapes, label, hidden=False):
    """Task 1: your pack_int4 and unpack_int4 on every case, with the course's versions forbidden.
    pack_cases: (codes, torch dtype); unpack_cases: bytes; odd_shapes: shapes with an odd last dimension.
    hidden: your outputs are compared by the grader (the formula's are not stated). Returns the number of cases."""
    own_packer(pack_int4, unpack_int4)
    with checks.reference_forbidden("pack_int4 and unpack_int4", forbidden=ANSWER_KEY):
        # " (case i)" keeps two cases of one shape and dtype apart in what the grader is handed
        for i, (q, dtype) in enumerate(pack_cases):
            check_pack(pack_int4, q, dtype, label, hidden, f" (case {i})")
        for i, b in enumerate(unpack_cases):
            check_unpack(unpack_int4, b, label, hidden, f" (case {i})")
        for i, (q, dtype) in enumerate(pack_cases):
            check_round_trip(pack_int4, unpack_int4, q, dtype, label, hidden, f" (case {i})")
        for shape in odd_shapes:
            check_odd(pack_int4, shape, label)
    return len(pack_cases) + len(unpack_cases) + len(odd_shapes)
