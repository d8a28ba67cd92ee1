"""``dl-nfv plan sfb``: choose the layers of an existing plan that exchange sufficient factors.

Loads the plan and the graph and topology it was made for (``--graph``/``--topology``,
else the paths the plan records, as ``plan export`` and ``simulate`` find them), runs
the SFB ILP (``planners/sfb.py``) and writes the plan with ``compression: sfb`` on the
chosen groups and its new prediction. The summary on stderr names the switched
layers, the simulated iteration time and the bytes per link class before and after.
"""

from __future__ import annotations

import click

from .options import Number, deliver, json_option, output_option
from .plan import _relative
from .plan import command as plan_group


def _summary(report: dict):
    def render(plan) -> str:
        ms = report["iteration_ms"]
        layers = report["layers"]
        shown = ", ".join(layers[:8]) + (f", ... ({len(layers)} in all)" if len(layers) > 8 else "")
        lines = [f"sfb: {len(report['groups'])} of {len(report['candidates'])} candidate groups, "
                 f"layers: {shown or 'none'}",
                 f"simulated iteration {ms['before']:.3f} -> {ms['after']:.3f} ms "
                 f"(ILP {report['ilp']['status']})"]
        for cls, nbytes in report["bytes_by_link_class"].items():
            lines.append(f"  {cls} links: {nbytes['before'] / 1e6:.3f} -> "
                         f"{nbytes['after'] / 1e6:.3f} MB")
        return "\n".join(lines)
    return render


@plan_group.command(name="sfb")
@click.argument("plan_path", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--graph", "graph_path", type=click.Path(dir_okay=False), default=None,
              help="Op graph of the plan (default: the one the plan records).")
@click.option("--topology", "topology_path", type=click.Path(dir_okay=False), default=None,
              help="Topology of the plan (default: the one the plan records).")
@click.option("--time-limit", "time_limit_s", type=Number(min=0), default=30.0,
              show_default=True, help="Seconds the ILP solver may search.")
@output_option("Write the plan with SFB here (.json, .yaml or .yml).")
@json_option
def sfb_command(plan_path, graph_path, topology_path, time_limit_s, output, as_json):
    """Apply lossless sufficient-factor broadcasting (SFB) to the layers of a plan where it pays.

    An ILP over the plan's replicated groups trades each matmul layer's gradient
    AllReduce for an all-gather of its input activations and output gradients plus a
    local recomputation, within every device's memory; the choice is kept only where
    the simulated iteration time does not rise.

    \b
    Example:
      dl-nfv plan sfb plan.json -o plan-sfb.json
    """
    from dataclasses import replace

    from dl_nfv.planners.sfb import sfb_files

    plan, report, gpath, tpath = sfb_files(plan_path, graph=graph_path, topology=topology_path,
                                           time_limit_s=time_limit_s)
    plan = replace(plan, graph_path=_relative(str(gpath), output),
                   topology_path=_relative(str(tpath), output))
    deliver(plan, output, as_json, summary=_summary(report), document="json")
