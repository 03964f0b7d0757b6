"""Every rate-limit algorithm in one table, and the set of policies one call decides.

An algorithm is a policy class (``policies``), its reference model (``model``)
and its Lua fragment (``lua/ratelimit/<name>.lua``), registered together in
``ALGORITHMS`` under the kind id the scripts receive, with how its quota is leased
(``lease_model``: a window, a bucket, or not leased and why). Everything else (the
scripts a call is composed of, the limiter's checks, leasing, the differential tests)
reads this table. See ``docs/extending.md``, "Add a rate-limit algorithm".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from headway.ratelimit import lease_model, model, settle_model
from headway.ratelimit.lease_model import BucketLease, NotLeased, QuotaLeaseModel, WindowLease
from headway.ratelimit.model import ModelCheck
from headway.ratelimit.policies import (
    FixedWindow,
    LeakyBucket,
    Policy,
    SlidingCounter,
    SlidingLog,
    TokenBucket,
)
from headway.ratelimit.settle_model import ModelSettle

__all__ = ["ALGORITHMS", "POLICY_CLASSES", "Algorithm", "PolicySet", "algorithm_of"]


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One algorithm: its kind id, policy class, reference model and Lua fragment."""

    kind: int  # the id ``ratelimit/decide.lua`` receives, and its fragment registers under
    policy: type[Policy]
    model: ModelCheck
    fragment: str  # the script its policies' calls include, under ``lua/``
    #: Its state is a string the decide script reads and writes (in one key with the other
    #: policies' strings), as its fragment's ``string_state`` says; else it keeps a key of its own.
    string_state: bool = True
    #: Whether and how a lease takes its quota: required, so that a new algorithm is
    #: never silently left out of leasing (``lease_model``).
    lease: QuotaLeaseModel = field(kw_only=True)
    #: How a reservation settles (``settle_model``; its fragment
    #: ``lua/ratelimit/settling/<name>.lua``): required, as every algorithm must settle.
    settle: ModelSettle = field(kw_only=True)

    @property
    def settle_fragment(self) -> str:
        """The script of its settle rule, under ``lua/``."""
        return "ratelimit/settling/" + self.policy.name

    def __post_init__(self) -> None:
        name = f"{self.policy.__name__} (kind {self.kind})"
        if not isinstance(self.lease, WindowLease | BucketLease | NotLeased):
            raise TypeError(
                f"{name} must say whether and how its quota is leased: lease=WindowLease(...), "
                "BucketLease(...) or NotLeased(reason) (docs/extending.md)"
            )
        if not self.string_state and not isinstance(self.lease, NotLeased):
            # ``lease.lua`` reads and writes every policy's state in one string key.
            raise ValueError(f"{name} keeps a key of its own: it cannot be leased")

    def leased(self) -> WindowLease | BucketLease:
        """How a lease takes this algorithm's quota (ValueError if it cannot)."""
        if isinstance(self.lease, NotLeased):
            # A ValueError, as for any policy a limiter refuses (not a wrong type).
            raise ValueError(  # noqa: TRY004
                f"{self.policy.__name__} cannot be leased: {self.lease.reason}"
            )
        return self.lease


ALGORITHMS: tuple[Algorithm, ...] = (
    Algorithm(
        1, TokenBucket, model.token_bucket, "ratelimit/token_bucket",
        lease=lease_model.token_bucket, settle=settle_model.token_bucket,
    ),
    Algorithm(
        2, LeakyBucket, model.leaky_bucket, "ratelimit/leaky_bucket",
        lease=lease_model.leaky_bucket, settle=settle_model.leaky_bucket,
    ),
    Algorithm(
        3, FixedWindow, model.fixed_window, "ratelimit/fixed_window",
        lease=lease_model.fixed_window, settle=settle_model.fixed_window,
    ),
    Algorithm(
        4, SlidingLog, model.sliding_log, "ratelimit/sliding_log", string_state=False,
        lease=NotLeased(
            "a sliding log records each unit when it is charged, so a unit spent later "
            "would leave its window early (see docs/ratelimit.md, 'Leased quota')"
        ),
        settle=settle_model.sliding_log,
    ),
    Algorithm(
        5, SlidingCounter, model.sliding_counter, "ratelimit/sliding_counter",
        lease=lease_model.sliding_counter, settle=settle_model.sliding_counter,
    ),
)  # fmt: skip

#: The policy classes a limiter accepts.
POLICY_CLASSES: tuple[type[Policy], ...] = tuple(a.policy for a in ALGORITHMS)
_BY_CLASS = {a.policy: a for a in ALGORITHMS}


def algorithm_of(policy: Policy) -> Algorithm:
    """The algorithm ``policy`` runs."""
    return _BY_CLASS[type(policy)]


class PolicySet(tuple[Policy, ...]):
    """Policies decided together, with what every call sends computed once.

    ``specs`` holds each policy's ``(kind, a, b)``, ``flat`` the same run
    together (the scripts' arguments), ``checks`` each one's ``(model, a, b)``
    (the reference model's), ``leases`` each one's lease declaration. ``suffixes``
    names each policy's state (the in-memory backend's entries), ``stored`` the
    Redis keys that hold them. One policy's state is named by its parameters.
    Several policies keep theirs under the name of the whole set: every string
    state in one key (a decision reads and writes it once, as the server charges
    about a round trip's worth per command), and a key each for the others (a
    sliding log's zset); a limiter with other policies shares none.
    """

    specs: tuple[tuple[int, int, int], ...]
    flat: tuple[int, ...]
    checks: tuple[tuple[ModelCheck, int, int], ...]
    settles: tuple[tuple[ModelSettle, int, int], ...]
    leases: tuple[QuotaLeaseModel, ...]
    suffixes: tuple[str, ...]
    stored: tuple[str, ...]
    algorithms: tuple[Algorithm, ...]  # the algorithms used, by kind, once each

    def __new__(cls, policies: Iterable[Policy]) -> PolicySet:
        self = super().__new__(cls, policies)
        used = [algorithm_of(p) for p in self]
        self.specs = tuple((a.kind, *p.params()) for a, p in zip(used, self, strict=True))
        self.flat = tuple(n for spec in self.specs for n in spec)
        self.checks = tuple((a.model, *p.params()) for a, p in zip(used, self, strict=True))
        self.settles = tuple((a.settle, *p.params()) for a, p in zip(used, self, strict=True))
        self.leases = tuple(a.lease for a in used)
        parts = [p.key_part for p in self]
        if len(parts) == 1:
            self.suffixes = self.stored = (parts[0],)
        else:
            joined = "+".join(parts)
            self.suffixes = tuple(f"{joined}/{part}" for part in parts)
            own = tuple(
                f"{joined}/{p.key_part}"
                for a, p in zip(used, self, strict=True)
                if not a.string_state
            )
            self.stored = own if len(own) == len(parts) else (joined, *own)
        self.algorithms = tuple(sorted(set(used), key=lambda a: a.kind))
        return self

    @classmethod
    def of(cls, policies: Iterable[Policy]) -> PolicySet:
        """``policies`` as a PolicySet (itself if it already is one)."""
        return policies if isinstance(policies, PolicySet) else cls(policies)
