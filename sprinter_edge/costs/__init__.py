"""What work costs on this machine and what the replies so far show: below decoding (a proposer
prices its proposal lengths) and planning (the planner prices whole plans).

`table`: measured decode costs per call size, cached per machine, build and model.
`pricing`: the formulas, written once (geometric acceptance, a flat-batch machine).
`evidence`: acceptance rates learned as replies run, with priors and bounded memory.
"""

from .evidence import Evidence, Rate
from .pricing import Costs, expected_tokens, flat_table
from .table import CostTable, machine_costs, measure

__all__ = ["CostTable", "Costs", "Evidence", "Rate", "expected_tokens", "flat_table",
           "machine_costs", "measure"]
