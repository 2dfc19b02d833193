"""A PTX interpreter for the few 32-bit instructions of the TurboQuant kernel's inline assembly,
so that CI (no GPU; Triton's CPU interpreter runs no PTX) checks the assembly text itself on
every input it can take.

Semantics follow the PTX ISA manual: shl/shr shift by the amount modulo nothing (amounts here are
< 32), and/or are bitwise, `prmt.b32 d, a, b, c` (default mode) makes byte k of d from nibble k of
c: its low 3 bits pick byte 0-7 of {b, a} (a is bytes 0-3), its bit 3 replicates that byte's
sign bit instead; `mov.b32 {lo, hi}, r` splits r into two 16-bit registers. Values are int64
tensors holding unsigned 32-bit (or 16-bit) numbers, one lane per element.
"""

from __future__ import annotations

import re
from typing import Dict, List

import torch

MASK32 = 0xFFFFFFFF
_OPERAND = re.compile(r"\$\d+|[A-Za-z_]\w*|0[xX][0-9a-fA-F]+|\d+")


def _prmt(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    source = (b << 32) | a  # bytes 0-3 from a, 4-7 from b
    out = torch.zeros(torch.broadcast_shapes(a.shape, b.shape, c.shape), dtype=torch.int64)
    for k in range(4):
        nibble = (c >> (4 * k)) & 0xF
        byte = (source >> (8 * (nibble & 7))) & 0xFF
        byte = torch.where((nibble & 8) != 0, torch.where((byte & 0x80) != 0, 0xFF, 0), byte)
        out |= byte << (8 * k)
    return out


def run(asm: str, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Execute asm with the operands inputs ({"$8": tensor, ...}); returns every register written,
    the $-operands among them. ValueError on an instruction outside the subset."""
    regs: Dict[str, torch.Tensor] = {name: value & MASK32 for name, value in inputs.items()}

    def value(token: str) -> torch.Tensor:
        if token in regs:
            return regs[token]
        if re.fullmatch(r"0[xX][0-9a-fA-F]+|\d+", token):
            return torch.tensor(int(token, 0), dtype=torch.int64)
        raise ValueError(f"read of {token!r} before it was written")

    body = asm.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError("expected one { ... } block")
    for statement in body[1:-1].split(";"):
        statement = statement.strip()
        if not statement or statement.startswith(".reg"):
            continue
        opcode, _, rest = statement.partition(" ")
        if opcode == "mov.b32" and rest.lstrip().startswith("{"):
            halves, source = rest.split("}", 1)
            lo, hi = [h.strip() for h in halves.strip(" {").split(",")]
            whole = value(source.strip(" ,"))
            regs[lo], regs[hi] = whole & 0xFFFF, (whole >> 16) & 0xFFFF
            continue
        ops: List[str] = _OPERAND.findall(rest)
        dest, args = ops[0], [value(t) for t in ops[1:]]
        if opcode == "shr.u32":
            result = args[0] >> args[1]
        elif opcode == "shl.b32":
            result = args[0] << args[1]
        elif opcode == "and.b32":
            result = args[0] & args[1]
        elif opcode == "or.b32":
            result = args[0] | args[1]
        elif opcode == "prmt.b32":
            result = _prmt(args[0], args[1], args[2])
        else:
            raise ValueError(f"instruction outside the subset: {statement!r}")
        regs[dest] = result & MASK32
    return regs
