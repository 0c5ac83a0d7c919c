"""A check's answer: ``ok``, ``problem`` (with what to change) or ``skip`` (it cannot tell)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

Status = Literal["ok", "problem", "skip"]
STATUSES: tuple[Status, ...] = get_args(Status)
OK: Final = "ok"
PROBLEM: Final = "problem"
SKIP: Final = "skip"


@dataclass(frozen=True)
class Check:
    """One check's answer: ``detail`` says what it found, ``fix`` what to change."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status != PROBLEM

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def problem(name: str, detail: str, fix: str) -> Check:
    return Check(name, PROBLEM, detail, fix)


def skip(name: str, detail: str) -> Check:
    return Check(name, SKIP, detail)
