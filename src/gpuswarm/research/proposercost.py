"""What the proposer agent spent on each variant (issue 34), in results.tsv, ``research log``
(``--json`` too) and the research report.

An agent proposal's usage (:mod:`gpuswarm.research.spend`) goes into its variant's ``meta``
(``proposer_tokens``: in + out, ``proposer_usd``; absent where the CLI reported none or the
cost is unknown). results.tsv keeps the seed's five columns first and unchanged; once some
variant has proposer usage, two columns follow: ``proposer_tokens`` and ``proposer_usd``,
empty where unknown (a baseline, a mutation, a proposal whose cost is unknown).
"""

from __future__ import annotations

from collections.abc import Container

from gpuswarm.research.entries import ProposalUsage, VariantMeta
from gpuswarm.research.journal import ExperimentState, Variant
from gpuswarm.research.payloads import Spent

COLUMNS = ("proposer_tokens", "proposer_usd")


def usage_meta(fields: ProposalUsage) -> VariantMeta:
    """A proposal's usage fields (``tokens_in`` ... ``cost_usd``) as its variant's meta."""
    out: VariantMeta = {}
    tin, tout = fields.get("tokens_in"), fields.get("tokens_out")
    if isinstance(tin, int) or isinstance(tout, int):
        out["proposer_tokens"] = (tin if isinstance(tin, int) else 0) + (
            tout if isinstance(tout, int) else 0
        )
    cost = fields.get("cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        out["proposer_usd"] = round(float(cost), 6)
    return out


def spent(v: Variant | None) -> Spent:
    """``proposer_tokens`` and ``proposer_usd`` of a variant (None where unknown)."""
    meta: VariantMeta = v.meta if v is not None else {}
    return {
        "proposer_tokens": meta.get("proposer_tokens"),
        "proposer_usd": meta.get("proposer_usd"),
    }


def any_spent(state: ExperimentState) -> bool:
    return any(k in v.meta for v in state.variants.values() for k in COLUMNS)


def _cells(v: Variant | None) -> list[str]:
    return ["" if x is None else f"{x:g}" for x in spent(v).values()]


def tsv_header(seed: list[str], state: ExperimentState) -> list[str]:
    """results.tsv's header: the seed's, then the proposer's columns where some variant has them."""
    return [*seed, *COLUMNS] if any_spent(state) else seed


def tsv_rows(state: ExperimentState, only: Container[str] | None = None) -> list[list[str]]:
    """results.tsv's rows in experiment order (:meth:`ExperimentState.rows_in_order`), each
    with the proposer's cells where the header has them."""
    if not any_spent(state):
        return state.rows_in_order(only)
    order = {vid: n for n, vid in enumerate(state.variants)}
    pairs = sorted(
        zip(state.row_ids, state.rows, strict=False), key=lambda p: order.get(p[0], len(order))
    )
    return [
        [*row, *_cells(state.variants.get(vid))]
        for vid, row in pairs
        if only is None or vid in only
    ]
