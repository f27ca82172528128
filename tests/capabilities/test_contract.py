"""A capability's summary of one concrete effect: the line approvers read and the model is told."""

from __future__ import annotations

from capabilities.contract import MAX_SUMMARY, Capability

REFUND = Capability(
    id="refund",
    version="1",
    tool_name="refund_order",
    backend="b",
    input_schema={},
    summary="refund {amount} {currency} to order {order_id}",
)
LOOKUP = Capability(id="lookup", version="1", tool_name="lookup_order", backend="b", input_schema={})


def test_a_summary_names_the_effect_from_its_template_or_the_tool_and_arguments() -> None:
    assert REFUND.summarize({"amount": 5, "currency": "EUR", "order_id": "1"}) == "refund 5 EUR to order 1"
    assert REFUND.summarize({"amount": 5}) == "refund 5 {currency} to order {order_id}"
    assert LOOKUP.summarize({"order_id": "1001"}) == "lookup_order(order_id='1001')"


def test_a_summary_template_that_does_not_fit_the_arguments_falls_back_to_the_tool_and_arguments() -> None:
    # An index, attribute or format spec over a value of another shape raised (KeyError, TypeError,
    # AttributeError) in the pipeline: an internal error, and the call was not recorded.
    for template, arguments in (
        ("refund to {order[id]}", {"order": {}}),
        ("refund to {order[id]}", {"order": "1001"}),
        ("refund {amount:.2f}", {"amount": {"x": 1}}),
        ("refund to {order.id}", {"order": "1001"}),
    ):
        capability = Capability(
            id="r", version="1", tool_name="refund_order", backend="b", input_schema={}, summary=template
        )
        (name, value), *_ = arguments.items()
        assert capability.summarize(arguments) == f"refund_order({name}={value!r})"


def test_a_summary_of_huge_arguments_stays_one_line_and_says_how_long_it_was() -> None:
    # It was as long as the arguments: stored with the call, told to the model, shown to approvers.
    for capability, arguments in (
        (LOOKUP, {"order_id": "x" * 1_000_000}),
        (LOOKUP, {f"k{i}": i for i in range(50_000)}),
        (REFUND, {"amount": 5, "currency": "EUR", "order_id": "9" * 1_000_000}),
    ):
        summary = capability.summarize(arguments)
        assert len(summary) == MAX_SUMMARY and summary.endswith("characters in all)")
