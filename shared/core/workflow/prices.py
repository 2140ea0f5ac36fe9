"""The price table: USD per million tokens of well-known models, by the name a request carries
(docs/workflow.md, "Budgets").

A model's price is, in order: its own ``price:``; the workflow's ``prices:`` entry for its model name (a
table of your own, extending or overriding this one); this table's entry; none (its calls cost USD 0, and a
``max_cost_usd`` never stops them). The figures are the providers' published list prices for standard
(non-batch, uncached) input and output tokens, as of 2025; prices change — set ``price:`` or ``prices:``
for what you are billed.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from reel.shared.core.workflow.modelspec import ModelSpec, Price

PRICES: Mapping[str, Price] = {
    "gpt-4o": Price(input_usd_per_mtok=2.50, output_usd_per_mtok=10.00),
    "gpt-4o-mini": Price(input_usd_per_mtok=0.15, output_usd_per_mtok=0.60),
    "gpt-4.1": Price(input_usd_per_mtok=2.00, output_usd_per_mtok=8.00),
    "gpt-4.1-mini": Price(input_usd_per_mtok=0.40, output_usd_per_mtok=1.60),
    "gpt-4.1-nano": Price(input_usd_per_mtok=0.10, output_usd_per_mtok=0.40),
    "o3-mini": Price(input_usd_per_mtok=1.10, output_usd_per_mtok=4.40),
    "claude-3-5-sonnet-latest": Price(input_usd_per_mtok=3.00, output_usd_per_mtok=15.00),
    "claude-3-5-haiku-latest": Price(input_usd_per_mtok=0.80, output_usd_per_mtok=4.00),
}
"""Model name (as sent in the request's ``model``) → its list price."""


def price_for(model: ModelSpec, table: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``model``'s calls: its ``price``, else ``table`` (a workflow's ``prices:``) then
    :data:`PRICES` by :attr:`ModelSpec.model_name`; ``None``: unpriced (USD 0)."""
    if isinstance(model.price, Price):
        return model.price
    name = model.model_name
    if table is not None and name in table:
        return table[name]
    return PRICES.get(name)


def priced(model: ModelSpec, table: Mapping[str, Price] | None = None) -> ModelSpec:
    """``model`` with its price resolved by :func:`price_for` (the spec an adapter is built from, so the cost
    it records is the one a budget's worst case was priced with); unchanged when it is unpriced or has its own."""
    if isinstance(model.price, Price):
        return model
    price = price_for(model, table)
    return model if price is None else msgspec.structs.replace(model, price=price)
