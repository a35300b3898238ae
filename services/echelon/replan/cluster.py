"""The routing job's side of the cluster's gRPC contract (blocking calls): the view, the
plan, the matchers' samples and zones, and `Control.PushPlan` with its retry rule.

Channels come from the one transport (`echelon.contract.transport`): plain text, or mTLS
with the job's certificate (role `replan`) from `ECHELON_TLS_DIR` / `--tls-dir`
(`configure`), and on clusters run with `--auth` a cluster admin's bearer token from
`ECHELON_TOKEN` / `--token` (a certificate, when there is one, names the job instead).
The job is one process with one identity, so the choice is module-wide."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from echelon.core.can import Zone
from echelon.contract.transport import TOKEN_ENV, TlsDir, Transport
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc

TIMEOUT = 10.0
PUSH_ATTEMPTS = 5
ALIVE = (mpb.MEMBER_STATE_ALIVE, mpb.MEMBER_STATE_SUSPECT)
_transport = Transport(TlsDir.from_env(), token=os.environ.get(TOKEN_ENV, ""))


def configure(tls_dir: str | Path | None, token: str = "") -> None:
    """mTLS with the certificates in `tls_dir` (None or "": plain text); `token`: the
    bearer token every call carries ("": none)."""
    global _transport
    _transport = Transport(TlsDir(Path(tls_dir)) if tls_dir else None, token=token)


def _dial(address: str) -> grpc.Channel:
    return _transport.dial_blocking(address)


def view(address: str) -> mpb.View:
    """A snapshot of the membership view (the first message of Watch)."""
    with _dial(address) as ch:
        call = mgrpc.MembershipStub(ch).Watch(mpb.WatchRequest(member_id="replan"), timeout=TIMEOUT)
        for update in call:
            call.cancel()
            if update.HasField("snapshot"):
                return update.snapshot
    raise RuntimeError(f"membership {address}: no view")


def alive(v: mpb.View, *roles: int) -> list[mpb.Member]:
    return sorted((m for m in v.members if m.role in roles and m.state in ALIVE), key=lambda m: m.id)


def current_plan(address: str) -> mpb.RoutingPlan:
    with _dial(address) as ch:
        return mgrpc.ControlStub(ch).GetPlan(mpb.GetPlanRequest(), timeout=TIMEOUT)


def sample(address: str, max_points: int) -> xpb.SampleResponse:
    with _dial(address) as ch:
        return xgrpc.MatcherStub(ch).Sample(xpb.SampleRequest(max_points=max_points), timeout=TIMEOUT)


def list_zones(address: str) -> xpb.ListZonesResponse:
    with _dial(address) as ch:
        return xgrpc.MatcherStub(ch).ListZones(xpb.ListZonesRequest(), timeout=TIMEOUT)


@dataclass
class Layouts:
    zones: dict[str, list[Zone]]  # topic -> active zones
    sources: dict[str, str]
    settled: bool  # every matcher routes with one layout per topic, none pending


def layouts(addresses: list[str]) -> Layouts:
    """The active zones per topic, and whether every matcher agrees on them."""
    replies = [list_zones(a) for a in addresses]
    zones: dict[str, list[Zone]] = {}
    sources: dict[str, str] = {}
    keys: dict[str, set[str]] = {}
    settled = True
    for r in replies:
        for t in r.topics:
            keys.setdefault(t.topic, set()).add(t.active)
            settled &= not t.pending
            if t.zones and t.topic not in zones:
                zones[t.topic] = [Zone(z.id, tuple(z.low), tuple(z.high), z.members[0], tuple(z.members[1:]))
                                  for z in t.zones]
                sources[t.topic] = t.source
    settled &= all(len(k) == 1 for k in keys.values())
    return Layouts(zones, sources, settled)


def point_rows(samples: list[xpb.SampleResponse]) -> tuple[list[tuple], dict[str, np.ndarray]]:
    """Subscription sample rows (transforms.POINT_SCHEMA) and event points per topic."""
    rows, events = [], {}
    for s in samples:
        for t in s.topics:
            if not t.dims:
                continue
            for p in t.subscriptions:
                pts = np.asarray(p.coordinates, dtype=np.float64).reshape(-1, t.dims)
                rows += [(t.topic, s.member, p.zone, int(p.total), k, [float(x) for x in pt])
                         for k, pt in enumerate(pts)]
            e = np.asarray(t.events.coordinates, dtype=np.float64).reshape(-1, t.dims)
            events[t.topic] = np.concatenate([events[t.topic], e]) if t.topic in events else e
    return rows, events


def report_run(address: str, result: str, reason: str = "") -> None:
    """Control.ReportRun: this run's outcome, counted by membership for the job's alerts."""
    with _dial(address) as ch:
        mgrpc.ControlStub(ch).ReportRun(mpb.RunReport(result=result, reason=reason[:2000]), timeout=TIMEOUT)


class PlanRefused(Exception):
    """Membership refused the plan (INVALID_ARGUMENT): the reason is the message."""


def push(address: str, plan: mpb.RoutingPlan, attempts: int = PUSH_ATTEMPTS) -> int:
    """PushPlan at the current version + 1; FAILED_PRECONDITION (someone pushed first)
    retries with a fresh version, at most `attempts` times. Returns the version accepted."""
    with _dial(address) as ch:
        control = mgrpc.ControlStub(ch)
        for attempt in range(attempts):
            out = mpb.RoutingPlan()
            out.CopyFrom(plan)
            out.version = control.GetPlan(mpb.GetPlanRequest(), timeout=TIMEOUT).version + 1
            out.created_unix_ms = int(time.time() * 1000)
            try:
                return control.PushPlan(out, timeout=TIMEOUT).version
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise PlanRefused(e.details()) from None
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION or attempt + 1 == attempts:
                    raise
                time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")
