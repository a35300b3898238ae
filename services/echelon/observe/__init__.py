"""What we watch: one definition of the dashboards, recording rules and alerts
(`catalog`), turned into Grafana JSON (`grafana`) and Prometheus rules (`rules`) by
`python -m echelon.observe.generate`; a local Prometheus that scrapes a cluster
(`prometheus`); the same panels live in the terminal (`top`) and the topology picture
(`topology`)."""
