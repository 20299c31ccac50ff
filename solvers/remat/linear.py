"""A solver-neutral linear model: built once, handed to any backend adapter."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LinearModel:
    """Variables by index; rows lo ≤ Σ coef·x ≤ hi; minimise Σ objective coef·x."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rows: list[tuple[list[int], list[float], float, float]] = field(default_factory=list)
    objective: dict[int, float] = field(default_factory=dict)

    @property
    def num_vars(self) -> int:
        return len(self.lower)

    def var(self, name: str, lo: float, hi: float, integer: bool) -> int:
        self.lower.append(lo)
        self.upper.append(hi)
        self.integer.append(integer)
        self.names.append(name)
        return len(self.lower) - 1

    def row(self, idx: list[int], coef: list[float], lo: float, hi: float) -> None:
        self.rows.append((idx, coef, lo, hi))


INF = float("inf")
