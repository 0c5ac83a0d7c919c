"""Prometheus metrics for node_exporter's textfile collector (docs/admin.md lists the series).

With ``[metrics] textfile_dir`` set, two files appear there, each written whole by a
rename (node_exporter never reads half of one), root's, mode 0644:

- ``bootseer_agent.prom``: the node agent's gauges and counters, every
  ``[metrics] interval`` seconds and at its exit (:mod:`bootseer.agent.metrics`);
- ``bootseer_hooks.prom``: counters and histograms of every prolog and epilog run on
  the node, each run adding to what the file held (:mod:`bootseer.metrics.hooks`).

Labels take only values from small fixed sets (hook, step, phase, outcome, source);
never a job id, user or image, so a thousand nodes make a few hundred series each.
"""
