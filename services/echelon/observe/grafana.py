"""Grafana dashboards from the catalog, built with grafana-foundation-sdk (Grafana's own
typed builders, schema of the Grafana release it is pinned to).

Every dashboard has a `datasource` variable (any Prometheus), and `namespace` (one
release's), `region` and `topic` query variables (multi-value, "All" = `.*`); panels lay out two to a row.
"""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dm

from echelon.observe.catalog import Dashboard, Panel

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
WIDTH, HEIGHT = 12, 8


def _variable(name: str, query: str) -> gd.QueryVariable:
    return (gd.QueryVariable(name).label(name).datasource(DATASOURCE).query(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dm.VariableOption(text="All", value="$__all", selected=True)))


def _panel(p: Panel, index: int):
    builder = stat.Panel() if p.kind == "stat" else timeseries.Panel()
    builder = (builder.id(index + 1).title(p.title).description(p.description).unit(p.unit).datasource(DATASOURCE)
               .grid_pos(dm.GridPos(h=HEIGHT, w=WIDTH, x=(index % 2) * WIDTH, y=(index // 2) * HEIGHT)))
    for i, query in enumerate(p.queries):
        ref = chr(ord("A") + i)
        builder = builder.with_target(gp.Dataquery().expr(query.expr).legend_format(query.legend or "__auto")
                                      .ref_id(ref).datasource(DATASOURCE))
        if query.unit and query.unit != p.unit:
            builder = builder.override_by_query(ref, [dm.DynamicConfigValue(id_val="unit", value=query.unit)])
    return builder


def build(d: Dashboard) -> dm.Dashboard:
    builder = (gd.Dashboard(d.title).uid(d.uid).description(d.description).tags(["echelon"]).refresh("30s")
               .time("now-1h", "now").timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
               .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
               .with_variable(_variable("namespace", "label_values(echelon_membership_plan_version, namespace)"))
               .with_variable(_variable("region", "label_values(up{job=~\"agent|matcher|membership|router\"}, region)"))
               .with_variable(_variable("topic", "label_values(echelon_agent_published_total, topic)")))
    for i, p in enumerate(d.panels):
        builder = builder.with_panel(_panel(p, i))
    return builder.build()


def to_json(d: Dashboard) -> str:
    """The dashboard as the library's model encodes it once read back (a fixed point: the
    decoder adds the panel plugins' empty defaults)."""
    model = load(json.dumps(build(d), cls=JSONEncoder))
    return json.dumps(model, cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def load(text: str) -> dm.Dashboard:
    """A dashboard file read back into the library's typed model (fails on a shape it does not know)."""
    register_default_plugins()  # so panels and Prometheus queries decode to their typed models
    return dm.Dashboard.from_json(json.loads(text))
