"""The names ADM's suite's report had before FID and ADM's suite shared one
(``dew.scoring.protocol_results``), kept so their imports resolve."""

from dew.scoring.protocol_results import report as adm_report
from dew.scoring.protocol_results import scores as adm_scores
from dew.scoring.protocol_results import write_results as write_adm_results

__all__ = ["adm_report", "adm_scores", "write_adm_results"]
