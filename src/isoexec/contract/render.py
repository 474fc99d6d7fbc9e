"""Plain-text views of a contract for people; machines read `dump_json`."""

from .identity import identities
from .schema import Contract


def _constants(constants: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(map(value, v)) + "]"
        return str(v)

    return " ".join(f"{k}={value(v)}" for k, v in constants.items()) or "-"


def _discharge(entry) -> str:
    d = entry.discharge
    return {"bitwise_equal_to": f"bitwise_equal_to {d.case}", "proof": f"proof {d.proof}", "none": "none"}[d.method]


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def render(contract: Contract) -> str:
    ids = identities(contract)
    lines = [f"contract {contract.name}" + (f" — {contract.description}" if contract.description else "")]
    m = contract.model
    lines += [f"model: family={m.family} architecture={m.architecture} profile={m.profile}", "", "identities"]
    lines += _table([[name, value] for name, value in ids.to_dict().items()])
    lines += ["", "cases"]
    rows = [["name", "role", "grad", "state", "max_seq_len", "max_num_seqs", "max_num_tokens", "max_query_len"]]
    for name, case in contract.cases.items():
        d = case.shape_domain
        rows.append([name, case.role, case.grad, case.state_mode] + [str(v) for v in (d.max_seq_len, d.max_num_seqs, d.max_num_tokens, d.max_query_len)])
    lines += _table(rows)
    lines += ["", "composition"]
    all_cases = set(contract.cases)
    rows = [["region", "cases", "impl", "discharge"]]
    for entry in contract.composition:
        cases = "all" if set(entry.cases) == all_cases else ",".join(entry.cases)
        rows.append([entry.region, cases, str(entry.impl), _discharge(entry)])
    table = _table(rows)
    lines.append(table[0])
    for entry, row in zip(contract.composition, table[1:]):
        lines += [row, f"      ops: {' '.join(entry.ops)}", f"      constants: {_constants(entry.constants)}"]
    c = contract.claims
    bitwise = " (0 = bitwise)" if c.is_bitwise else ""
    lines += ["", "claims"]
    lines.append(f"  tolerances: {_constants(c.tolerances) if c.tolerances else 'none claimed'}{bitwise}")
    lines.append(f"  topology: {_constants(vars(c.topology))}")
    lines.append(f"  state: {_constants(vars(c.state))}")
    lines += ["", "deployment"]
    lines.append(f"  engine: {_constants(vars(contract.deployment.engine))}")
    lines.append(f"  trainer: {_constants(vars(contract.deployment.trainer))}")
    return "\n".join(lines)
