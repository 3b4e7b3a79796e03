"""Does a verifier that reads the draft's hidden state beat the calibrated confidence rule?

The decision metric is the one that matters at run time: false passes at equal target cost.
Every candidate's scores are replayed along the collected SPRINTER trajectories through the
decoder's own run policy (`decoding.run_policy`: run counter, run cap, unscored tokens), each
target call priced by a cost model (milliseconds per catch-up of n tokens). At the confidence
rule's reference operating points, every other candidate gets the threshold that costs the
same target milliseconds per token on the same test rows (matching uses no labels), and the
two are compared by the expected false passes per token (sum of 1 - accept_prob over kept
tokens). Confidence intervals come from a bootstrap over test groups, so near-duplicate
prompts never count as independent evidence.

Data: one row per drafted token (`training.onpolicy`), split by prompt group, stratified by
domain. One model per temperature regime: greedy rows (temperature 0, target `label_greedy`)
and sampled rows (temperature > 0, soft target `accept_prob` via duplicated weighted rows).

One job per module: `data` (feature matrix, regime and domain masks, the grouped split),
`candidates` (the models compared), `fitting` (training targets, grid search, the final fit),
`replay` (the run-policy replay, cost model, cost matching), `bootstrap` (group-resampled
intervals), `comparison` (false passes at matched cost, AUC), `presets` (per-domain thresholds
and their check), `decision` (the verdict), `report` (JSON and markdown), `run` (the study end
to end).
"""

from .candidates import CANDIDATES, REFERENCE, ProjectedHGB, StudyCandidate, candidate
from .comparison import REFERENCE_THRESHOLDS, auc_by_domain, compare
from .data import AUC_LABEL, DOMAINS, FEATURE_NAMES, REGIMES, SCALARS, split_by_group
from .data import matrix_of as matrix_of  # the feature matrix `training.ship` exports a candidate from
from .fitting import fit_final
from .presets import presets_by_domain
from .replay import DEFAULT_COST_MS, simulate, table_cost
from .report import report_markdown
from .run import StudyConfig, run_study

__all__ = [
    "AUC_LABEL", "CANDIDATES", "DEFAULT_COST_MS", "DOMAINS", "FEATURE_NAMES", "REFERENCE",
    "REFERENCE_THRESHOLDS", "REGIMES", "SCALARS", "ProjectedHGB", "StudyCandidate", "StudyConfig",
    "auc_by_domain", "candidate", "compare", "fit_final", "presets_by_domain", "report_markdown",
    "run_study", "simulate", "split_by_group", "table_cost",
]
