"""CEL's cost per call: the demo policy decided by Writ's engine (cel-expr-python) and by cel-python.

    python bench/cel.py [--calls 5000]

Times `Policy.evaluate` for a refund and a lookup through the demo policy (CPU seconds of this
thread), then the same conditions through cel-python when it is installed (the test extra has it),
with the activation built the way Writ built it before: per call, once, shared by the rules.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from capabilities.contract import Capability
from policy import CallContext, Policy, PolicyInput, Principal
from policy.cel import Condition, activation_for

DEMO = Path(__file__).resolve().parent.parent / "demo" / "demo.yaml"


def _demo_policy() -> dict[str, Any]:
    """The demo config's `policy:` section (the rest of the file is a template `writ demo` fills in)."""
    lines = DEMO.read_text().splitlines()
    start = lines.index("policy:")
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1].isalpha()), len(lines))
    policy: dict[str, Any] = yaml.safe_load("\n".join(lines[start:end]))["policy"]
    return policy


def _inputs() -> list[PolicyInput]:
    roles, scopes = frozenset({"agent"}), frozenset({"tools"})
    agent = Principal(subject="agent-7", tenant="acme", roles=roles, scopes=scopes)
    now = datetime.now(UTC)
    schema = {"type": "object"}
    refund = Capability("refund-order", "2", "refund_order", "shop", schema, effect="irreversible")
    lookup = Capability("lookup-order", "1", "lookup_order", "shop", schema, effect="read")
    context = CallContext(now=now, run_call_count=1)
    return [
        PolicyInput(agent, refund, {"order_id": "1001", "amount": 250.0, "currency": "EUR"}, context),
        PolicyInput(agent, lookup, {"order_id": "1001"}, context),
    ]


def _cpu(work: Any, calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        work()
    return (time.thread_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000)
    calls = parser.parse_args().calls
    section = _demo_policy()
    policy = Policy.from_mapping(section)
    inputs = _inputs()
    conditions = [rule["when"] for rule in section["rules"] if rule.get("when")]
    for inp in inputs:
        policy.evaluate(inp)
    print(f"demo policy, {len(conditions)} conditions: {', '.join(conditions)}")
    for inp in inputs:
        us = _cpu(lambda inp=inp: policy.evaluate(inp), calls)
        print(f"  {inp.capability.tool_name:14} Writ's policy (cel-expr-python): {us:7.1f} µs CPU per call")
    try:
        import celpy
        from celpy import celtypes
    except ImportError:
        print("  cel-python is not installed (pip install -e '.[test]'): no comparison")
        return
    environment = celpy.Environment()
    programs = [environment.program(environment.compile(source)) for source in conditions]
    arguments = dict(inputs[0].arguments)

    def old() -> None:
        activation = {
            "args": celtypes.MapType(
                {
                    celtypes.StringType(k): celtypes.DoubleType(v)
                    if isinstance(v, float)
                    else celtypes.StringType(v)
                    for k, v in arguments.items()
                }
            )
        }
        for program in programs:
            program.evaluate(activation)

    compiled = [Condition.compile("c", source) for source in conditions]

    def new() -> None:
        activation = activation_for(inputs[0])
        for condition in compiled:
            condition.holds(activation)

    print(f"  refund_order's conditions alone, cel-expr-python: {_cpu(new, calls):7.1f} µs CPU per call")
    print(f"  refund_order's conditions alone, cel-python:      {_cpu(old, calls):7.1f} µs CPU per call")


if __name__ == "__main__":
    main()
