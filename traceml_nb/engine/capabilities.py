"""What a run could and could not measure, and why.

Every metric the report shows is either measured or "unavailable" with one of these reasons;
the report never shows a 0 for something it did not measure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Names used: "steps", "data_wait", "gpu_events", "gpu_memory", "nvml", "gpu_utilisation",
#: "host", "steal_time" (the host sampler's ``steal_pct``: only where the kernel reports it),
#: "profile" (``--profile``: the torch.profiler capture), "gpm" and one per GPM column:
#: "gpm_sm_active", "gpm_sm_occupancy", "gpm_tensor_active", "gpm_dram_bw"
#: (:mod:`traceml_nb.engine.sampling.gpm`).


@dataclass
class Capabilities:
    """``available[name]`` is True/False; ``reasons[name]`` says why something is missing.

    ``notes`` collects events that cost data mid-run (a GPU lost, the sampler stopped).
    """

    available: dict[str, bool] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def set(self, name: str, ok: bool, reason: str = "") -> None:
        self.available[name] = ok
        if ok:
            self.reasons.pop(name, None)
        else:
            self.reasons[name] = reason or "not measured"

    def ok(self, name: str) -> bool:
        return self.available.get(name, False)

    def why(self, name: str) -> str:
        """The reason ``name`` is unavailable ('' when it is available)."""
        if self.ok(name):
            return ""
        return self.reasons.get(name, "not measured in this run")

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": dict(self.available),
            "reasons": dict(self.reasons),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Capabilities:
        return cls(
            available={str(k): bool(v) for k, v in dict(data.get("available", {})).items()},
            reasons={str(k): str(v) for k, v in dict(data.get("reasons", {})).items()},
            notes=[str(n) for n in data.get("notes", [])],
        )
