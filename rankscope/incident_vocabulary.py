"""The words of an incident record: its fault classes and what an operator does about each,
its status, and the verdicts on out-of-band events (:mod:`rankscope.incident` holds the record)."""

from __future__ import annotations

from enum import StrEnum


class IncidentClass(StrEnum):
    """The fault classes the diagnosis names."""

    COMPUTE_STRAGGLER = "compute_straggler"
    LINK_DEGRADATION = "link_degradation"
    PIPELINE_IMBALANCE = "pipeline_imbalance"
    TRANSIENT_STALL = "transient_stall"
    HOST_STALL = "host_stall"
    SILENT_RANK = "silent_rank"
    #: A straggler named from its collectives alone (it arrives last): no compute stage recorded.
    ARRIVAL_STRAGGLER = "arrival_straggler"

    @property
    def label(self) -> str:
        """Words for people: ``compute straggler``."""
        return self.value.replace("_", " ")

    @property
    def short(self) -> str:
        """Two letters for incident ids: ``cs``."""
        return "".join(word[0] for word in self.value.split("_"))


#: What an operator does about each class (``{where}``: hosts or nodes, ``{ranks}``, ``{stage}``,
#: ``{Ranks}``: "Rank 7" / "Ranks 1-3").
ACTIONS: dict[IncidentClass, str] = {
    IncidentClass.COMPUTE_STRAGGLER: "Drain and replace {where}: the slowness is in compute-only work on "
                                     "those GPUs; network repairs will not restore the speed.",
    IncidentClass.LINK_DEGRADATION: "Check the NIC / links of {where}: the transfer floor of their "
                                    "collectives rose.",
    IncidentClass.PIPELINE_IMBALANCE: "Rebalance the pipeline stages: stage {stage} takes longer than the others.",
    IncidentClass.TRANSIENT_STALL: "No action unless it repeats: a short stall that passed on its own.",
    IncidentClass.HOST_STALL: "Check the host side (data loader, CPU, storage) of {where}.",
    IncidentClass.SILENT_RANK: "{Ranks} stopped reporting: check the processes on {where}.",
    IncidentClass.ARRIVAL_STRAGGLER: "Check the GPUs and host of {where} (its peers wait for it in every "
                                     "collective): drain them if they stay slow; network repairs will not "
                                     "restore the speed.",
}


class Verdict(StrEnum):
    """What the evidence says of an out-of-band event."""

    SUPPORTED = "supported"
    CONTRADICTED = "contradicted"
    UNRELATED = "unrelated"


class Status(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"
