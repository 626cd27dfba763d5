"""Reading a SASS listing into normalised code per function (pure).

:func:`parse_listing` reads what ``cuobjdump -sass`` or ``nvdisasm -c`` prints for a cubin
or a fatbin and returns each function's code, per arch, in a form that holds only what the
source decides:

- the ``/*0040*/`` address comments and the ``/* 0x... */`` encodings (with their
  scheduling control bits) are dropped;
- branch targets become labels ``L0``, ``L1`` … numbered by address within the function,
  whether the tool printed an address (cuobjdump: ``BRA 0x750``) or its own global label
  (nvdisasm: ``BRA `(.L_x_4)``); a ``L3:`` line stands before the target instruction;
- register numbers become ``R#``, ``UR#``, ``P#``, ``UP#``, ``B#`` (``RZ``, ``PT`` … stay),
  and the register-reuse hints ``.reuse`` go: a change of allocation alone shows nothing,
  and one added instruction shows as that line rather than as every line after it;
- the ``NOP`` padding after a function's last instruction is dropped.

So two listings of the same machine code read the same whichever tool printed them, and a
rebuild of the same source shows nothing. Constant-bank and memory offsets stay: they are
the program's (a parameter's place, a field's offset).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["FunctionCode", "normalise_instruction", "parse_listing"]

#: ``/*0040*/  @!P0 BRA 0x750 ;  /* 0x... */`` (the instruction, up to its ``;``).
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s*(.*?)\s*;?\s*(?:/\*[^*]*\*/\s*)?$")
#: nvdisasm's labels in a function (``.L_x_12:``, a local subroutine's ``$__internal_0_$…:``).
_LABEL = re.compile(r"^\s*([^\s:]+):\s*$")
#: The start of a function: cuobjdump's ``Function : name``, nvdisasm's text section.
_CUOBJDUMP_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
_SECTION = re.compile(r"^\s*\.section\s+([^,\s]+)")
#: The arch: cuobjdump's ``code for sm_90a``, either tool's ``.target sm_90a``.
_ARCH = re.compile(r"^\s*(?:code for|\.target)\s+(sm_\w+)\s*$")
#: Opcodes whose hex operand is an address in the function.
_CONTROL = frozenset(
    [
        "BRA",
        "BRX",
        "BRXU",
        "JMP",
        "JMX",
        "JMXU",
        "CALL",
        "RET",
        "BSSY",
        "SSY",
        "PBK",
        "PCNT",
        "PRET",
    ]
)
_HEX = re.compile(r"\b0x([0-9a-fA-F]+)\b")
_LOCAL_REF = re.compile(r"`\(([^)\s]+)\)")
_REGISTER = re.compile(r"\b(UR|UP|R|P|B)\d+\b")
_REUSE = re.compile(r"\.reuse\b")


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCode:
    """One function's normalised code for one arch."""

    arch: str
    name: str
    lines: tuple[str, ...]


@dataclass(slots=True)
class _Function:
    """A function as read: ``(address, instruction)`` and nvdisasm's label lines."""

    arch: str
    name: str
    instructions: list[tuple[int, str]] = field(default_factory=list)
    #: label -> the address of the instruction after it (None: at the end).
    labels: dict[str, int | None] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)


def parse_listing(text: str) -> tuple[FunctionCode, ...]:
    """Each function of a ``cuobjdump -sass`` or ``nvdisasm`` listing, normalised, sorted
    by (arch, name). A listing without functions gives ()."""
    functions: list[_Function] = []
    arch = ""
    current: _Function | None = None
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            address = int(m.group(1), 16)
            for label in current.pending:
                current.labels[label] = address
            current.pending.clear()
            current.instructions.append((address, m.group(2).strip()))
            continue
        if m:
            continue
        if (m := _ARCH.match(line)) is not None:
            arch = m.group(1)
        elif (m := _CUOBJDUMP_FUNCTION.match(line)) is not None:
            current = _Function(arch=arch, name=m.group(1))
            functions.append(current)
        elif (m := _SECTION.match(line)) is not None:
            section = m.group(1)
            current = None
            if section.startswith(".text."):
                current = _Function(arch=arch, name=section.removeprefix(".text."))
                functions.append(current)
        elif (m := _LABEL.match(line)) is not None and current is not None:
            _label_line(current, m.group(1))
    out = [_normalise(f) for f in functions]
    return tuple(sorted(out, key=lambda f: (f.arch, f.name)))


def _label_line(function: _Function, label: str) -> None:
    """A label before the function's next instruction (not the function's own names)."""
    if label not in (function.name, f".text.{function.name}"):
        function.pending.append(label)


def _normalise(function: _Function) -> FunctionCode:
    """Labels for the addresses the instructions branch to, numbered by address."""
    instructions = function.instructions
    end = max((a for a, _ in instructions), default=-1) + 1
    addresses = {a for a, _ in instructions}
    where = {k: end if a is None else a for k, a in function.labels.items()}
    for label in function.pending:
        where[label] = end
    where.setdefault(function.name, 0)  # nvdisasm's `(name)`: cuobjdump's 0x0
    returns = _return_addresses(instructions)
    targets: set[int] = set(returns.values())
    for _, text in instructions:
        target = _address_operand(text, addresses)
        if target is not None:
            targets.add(target)
        targets.update(where[k] for k in _LOCAL_REF.findall(text) if k in where)
    names = {a: f"L{i}" for i, a in enumerate(sorted(targets))}
    local = {k: names[a] for k, a in where.items() if a in names}
    lines: list[str] = []
    for i, (address, text) in enumerate(_unpadded(instructions)):
        if address in names:
            lines.append(f"{names[address]}:")
        if i in returns:
            last = list(_HEX.finditer(text))[-1]
            text = text[: last.start()] + names[returns[i]] + text[last.end() :]
        lines.append(normalise_instruction(text, names, local))
    if end in names:
        lines.append(f"{names[end]}:")
    return FunctionCode(arch=function.arch, name=function.name, lines=tuple(lines))


def _return_addresses(instructions: list[tuple[int, str]]) -> dict[int, int]:
    """``index -> address`` of the instructions that load a call's return address (the
    ``MOV R6, 0x140`` right before a ``CALL``, 0x140 the address after the call)."""
    out = {}
    for i in range(1, len(instructions) - 1):
        if _split(instructions[i][1])[1].split(".")[0] != "CALL":
            continue
        back = instructions[i + 1][0]
        found = _HEX.findall(_split(instructions[i - 1][1])[2])
        if found and int(found[-1], 16) == back:
            out[i - 1] = back
    return out


def _unpadded(instructions: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The instructions without the trailing ``NOP`` padding."""
    last = len(instructions)
    while last and instructions[last - 1][1].rstrip(" ;") == "NOP":
        last -= 1
    return instructions[:last]


def _split(text: str) -> tuple[str, str, str]:
    """(guard, opcode, operands) of an instruction: ``@!P0``, ``BRA``, ``0x750``."""
    guard = ""
    rest = text.strip()
    if rest.startswith("@"):
        guard, _, rest = rest.partition(" ")
    opcode, _, operands = rest.strip().partition(" ")
    return guard, opcode, operands.strip()


def _address_operand(text: str, addresses: set[int]) -> int | None:
    """The function address a control-flow instruction names in hex, if any."""
    _, opcode, operands = _split(text)
    if opcode.split(".")[0] not in _CONTROL:
        return None
    found = _HEX.findall(operands)
    if not found:
        return None
    value = int(found[-1], 16)
    return value if value in addresses else None


def normalise_instruction(
    text: str, labels: dict[int, str] | None = None, local: dict[str, str] | None = None
) -> str:
    """One instruction normalised: registers numbered ``#``, ``.reuse`` dropped, a branch
    target replaced by its label (``labels``: address -> label, ``local``: nvdisasm label
    -> label), spacing made single. Pure."""
    labels = labels or {}
    local = local or {}
    guard, opcode, operands = _split(text)
    if opcode.split(".")[0] in _CONTROL:
        found = list(_HEX.finditer(operands))
        if found and int(found[-1].group(1), 16) in labels:
            last = found[-1]
            name = labels[int(last.group(1), 16)]
            operands = operands[: last.start()] + name + operands[last.end() :]
    operands = _LOCAL_REF.sub(lambda m: local.get(m.group(1), m.group(0)), operands)
    operands = _REUSE.sub("", operands)
    operands = _REGISTER.sub(lambda m: m.group(1) + "#", operands)
    guard = _REGISTER.sub(lambda m: m.group(1) + "#", guard)
    operands = " ".join(operands.split())
    return " ".join(part for part in (guard, opcode, operands) if part) + " ;"
