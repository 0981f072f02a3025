"""The kinds of root cause the dynamic pass reports, as rule-like metadata
(code, name, severity, summary, fix_hint) for SARIF and GitHub annotations."""

from __future__ import annotations

from dataclasses import dataclass

from detaudit.findings import Severity


@dataclass(frozen=True)
class CauseKind:
    code: str
    name: str
    summary: str
    fix_hint: str
    severity: Severity = Severity.ERROR


CAUSE_KINDS = {
    kind.name: kind
    for kind in (
        CauseKind(
            "DYN001",
            "nondeterministic-op",
            "An op produced different bits from bitwise-identical inputs.",
            "Call torch.use_deterministic_algorithms(True) (detaudit.enable_determinism()) or replace the op.",
        ),
        CauseKind(
            "DYN002",
            "rng",
            "A random op drew different numbers: the generator state differed between runs.",
            "Seed every generator once at start-up and do not reseed from entropy (torch.seed(), unseeded Generators).",
        ),
        CauseKind(
            "DYN003",
            "uninitialized-memory",
            "Values were read from an allocation (torch.empty*) that nothing wrote.",
            "Use torch.zeros/torch.full, or write every element before reading it.",
        ),
        CauseKind(
            "DYN004",
            "external-input",
            "Data entering from outside torch (numpy, Python values, files) differed between runs.",
            "Make the data source deterministic: seed numpy Generators, sort file lists and sets.",
        ),
        CauseKind(
            "DYN005",
            "control-flow",
            "The runs executed different ops or shapes.",
            "Find what the branch or shape depends on (time, pid, hash order, unseeded randomness).",
        ),
        CauseKind(
            "DYN006",
            "thread-count",
            "The result changes with the number of intra-op threads.",
            "Pin torch.set_num_threads() for reproducible CPU results across machines.",
            Severity.WARNING,
        ),
        CauseKind(
            "DYN007",
            "hash-order",
            "The result changes with PYTHONHASHSEED: something iterates a set or uses hash().",
            "Iterate sorted(...) instead of a set, or set PYTHONHASHSEED before the interpreter starts.",
        ),
    )
}

# which cause a variation turns a difference into, when pinning it removes the difference
VARIATION_KINDS = {"threads": "thread-count", "hashseed": "hash-order"}
