"""A real Prometheus (the Debian `prometheus` binary) scraping a local cluster, and a small
client of its HTTP API.

`scrape_config` turns a list of endpoints into a configuration: one job per role, every
target labelled with its `member` and `region` (the labels the dashboards filter on),
the catalog's rules loaded. Targets live in a file (`file_sd`), so `set_targets` changes
them without a restart. `Prometheus` runs the process on loopback and stops it by its pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROLES = ("membership", "matcher", "router", "agent")


@dataclass(frozen=True)
class Target:
    role: str  # becomes the `job` label
    member: str
    address: str  # host:port of /metrics
    region: str = "local"


class PromQLError(RuntimeError):
    """The query was refused (`bad_data`, `execution`, ...) or Prometheus did not answer."""


def scrape_config(interval: float, rule_files: list[str], targets_file: str) -> dict:
    seconds = f"{max(interval, 0.1):g}s"
    return {
        "global": {"scrape_interval": seconds, "evaluation_interval": seconds, "scrape_timeout": seconds},
        "rule_files": rule_files,
        "scrape_configs": [{
            "job_name": "echelon",
            "file_sd_configs": [{"files": [targets_file]}],
            # The file's `role` label names the job: one job per service, as on Kubernetes.
            "relabel_configs": [{"source_labels": ["role"], "target_label": "job"},
                                {"regex": "role", "action": "labeldrop"}],
        }],
    }


def target_groups(targets: list[Target]) -> list[dict]:
    return [{"targets": [t.address], "labels": {"role": t.role, "member": t.member, "region": t.region}}
            for t in sorted(targets, key=lambda t: (ROLES.index(t.role) if t.role in ROLES else 9, t.member))]


def cluster_targets(rows: list[dict]) -> list[Target]:
    """The scrape targets of a local cluster, from its processes' `as_dict()` rows."""
    return [Target(r["role"], r["id"], r["metrics"], r.get("region") or "local") for r in rows
            if r["role"] in ROLES and r.get("metrics")]


def start_for_cluster(rows: list[dict], port: int, data_dir: Path, interval: float = 2.0) -> "Prometheus | None":
    """`echelon up`'s Prometheus, scraping every service of the cluster; None (said on
    stderr) when it cannot run, so the cluster still comes up."""
    prometheus = Prometheus(cluster_targets(rows), port=port, interval=interval, data_dir=data_dir)
    try:
        prometheus.start()
    except (OSError, RuntimeError, TimeoutError) as e:
        print(f"no Prometheus: {e} (--no-prometheus skips it)", file=sys.stderr)
        return None
    return prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """`start()`, `url`, `query()`, `stop()`; the data lives in a temporary directory unless given."""

    def __init__(self, targets: list[Target], port: int = 0, interval: float = 5.0, data_dir: Path | None = None,
                 binary: str = "prometheus", retention: str = "6h"):
        self.targets = list(targets)
        self.port = port or free_port()
        self.interval = interval
        self.binary = shutil.which(binary) or binary
        self.retention = retention
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="echelon-prometheus-")
        self.dir = Path(data_dir or self._tmp.name).resolve()  # the config names its files absolutely
        self.popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def as_dict(self) -> dict:
        return {"url": self.url, "pid": self.popen.pid if self.popen else None, "data": str(self.dir)}

    @property
    def log(self) -> Path:
        return self.dir / "prometheus.log"

    def write_config(self) -> Path:
        from echelon.observe.rules import groups

        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rules.json").write_text(json.dumps({"groups": groups()}, indent=1))  # JSON is YAML
        self.set_targets(self.targets)
        config = self.dir / "prometheus.json"
        config.write_text(json.dumps(scrape_config(self.interval, [str(self.dir / "rules.json")],
                                                   str(self.dir / "targets.json")), indent=1))
        return config

    def set_targets(self, targets: list[Target]) -> None:
        """Replace the scraped endpoints; Prometheus watches the file (no restart)."""
        self.targets = list(targets)
        tmp = self.dir / "targets.json.tmp"
        tmp.write_text(json.dumps(target_groups(self.targets), indent=1))
        os.replace(tmp, self.dir / "targets.json")  # atomic: never a half-written file

    def start(self, timeout: float = 30.0) -> None:
        if shutil.which(self.binary) is None:
            raise FileNotFoundError(f"{self.binary}: not found (Debian package `prometheus`; `make install` "
                                    "installs it as root)")
        config = self.write_config()
        args = [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--storage.tsdb.retention.time={self.retention}", f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn"]
        with open(self.log, "ab") as log:
            # Its own session: a Ctrl-C at the terminal reaches `echelon up`, which stops it.
            self.popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.popen.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.popen.returncode}; log {self.log}:\n"
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"prometheus not ready on {self.url} after {timeout:.0f}s (log {self.log})")
            time.sleep(0.1)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def client(self) -> "PrometheusAPI":
        return PrometheusAPI(self.url)

    def __enter__(self) -> "Prometheus":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class PrometheusAPI:
    """The few calls of Prometheus' HTTP API we use (`/api/v1/...`)."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, **params) -> dict | list:
        query = urllib.parse.urlencode([(k, v) for k, vs in params.items() for v in (vs if isinstance(vs, list)
                                                                                  else [vs])])
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=self.timeout) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422 carry the error in a JSON body
            try:
                body = json.load(e)
            except ValueError:
                raise PromQLError(f"{path}: HTTP {e.code}") from None
        except (OSError, ValueError) as e:
            raise PromQLError(f"{self.url}: {e}") from None
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query: `[{"metric": {...}, "value": [t, "1.5"]}, ...]` (scalars as one sample)."""
        data = self._get("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        """`[{"metric": {...}, "values": [[t, "1.5"], ...]}, ...]`"""
        data = self._get("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{max(step, 0.001):g}")
        if data["resultType"] == "scalar":
            return [{"metric": {}, "values": data["result"]}]
        return data["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        return self._get(f"label/{urllib.parse.quote(label)}/values", **{"match[]": match})

    def targets(self) -> list[dict]:
        return self._get("targets")["activeTargets"]

    def alerts(self) -> list[dict]:
        return self._get("alerts")["alerts"]

    def rules(self) -> list[dict]:
        return [r for g in self._get("rules")["groups"] for r in g["rules"]]
