"""The shadow report: divergence, confidence, coverage and the gate table of a recorded run.

`analyze_bag` replays a bag through the same ShadowAccumulator the live comparator uses, with the
same rule that evidence restarts at every stage or policy-version change; `write_report` writes
report.json (usable as `sim2real rollout promote --evidence`), PNG plots and a markdown or HTML
page.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from sim2real_ros.config import ConfigError
from sim2real_ros.ros.convert import MessageError, joint_state_to_arrays, stamp_to_ns
from sim2real_ros.shadow.divergence import (
    InterventionCheck,
    ShadowAccumulator,
    ShadowMetrics,
    StepDivergence,
    TrainingStats,
    WouldBeIntervention,
    json_default,
    windows,
)
from sim2real_ros.shadow.gates import (
    STAGES,
    GateResult,
    Recommendation,
    RolloutConfig,
    evaluate,
    recommend,
)

TOPICS: dict[str, str] = {
    "policy": "policy/joint_command",
    "baseline": "baseline/joint_command",
    "joint_states": "joint_states",
    "confidence": "policy/confidence",
    "status": "safety_filter/status",
    "events": "safety_filter/events",
    "transitions": "shadow_comparator/transitions",
    "version": "policy_node/active_version",
}
REQUIRED = ("policy", "baseline")


@dataclass
class Segment:
    """Evidence of one stretch at one stage with one policy version."""

    stage: str
    version: int | None
    metrics: ShadowMetrics


@dataclass
class BagAnalysis:
    """What a bag says about the policy in shadow."""

    bag: str
    joint_names: list[str]
    stage: str
    stage_known: bool
    metrics: ShadowMetrics  # the last segment: the evidence for the next gate
    recommendation: Recommendation
    all_gates: dict[str, GateResult]
    segments: list[Segment]
    steps: list[StepDivergence]  # every aligned step of the bag, for plots
    disagreement_rad: np.ndarray
    ood_score: np.ndarray
    interventions: list[WouldBeIntervention]  # the hard ones (soft ones are counted by kind)
    transitions: list[dict[str, Any]]
    safety_events: int
    topic_counts: dict[str, int]
    intervention_source: str
    stats_source: str
    config: RolloutConfig
    malformed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON report (same layout as shadow_comparator/report)."""
        return {
            "source": "bag",
            "bag": self.bag,
            "stage": self.stage,
            "stage_known": self.stage_known,
            "joints": self.joint_names,
            "intervention_check": self.intervention_source,
            "training_stats": self.stats_source,
            "metrics": self.metrics.as_dict(),
            "recommendation": self.recommendation.as_dict(),
            "all_gates": {k: g.as_dict() for k, g in self.all_gates.items()},
            "segments": [
                {"stage": s.stage, "policy_version": s.version, "steps": s.metrics.steps,
                 "time_s": s.metrics.time_s, "agreement_rate": s.metrics.agreement_rate}
                for s in self.segments
            ],
            "transitions": self.transitions,
            "safety_events": self.safety_events,
            "topic_counts": self.topic_counts,
            "malformed_inputs": self.malformed[:20],
            "rollout_config": self.config.path,
        }


def analyze_bag(
    bag: str | Path,
    joint_names: Sequence[str],
    config: RolloutConfig,
    intervention_check: InterventionCheck | None = None,
    training_stats: TrainingStats | None = None,
    intervention_source: str = "none",
    stats_source: str = "none",
) -> BagAnalysis:
    """Replay `bag` through the shadow metrics; BagError for unreadable bags or missing topics."""
    from sim2real_ros.sysid.bags import BagError, bag_info, read_messages, resolve_topic

    p = Path(bag)
    info = bag_info(p)
    resolved: dict[str, str] = {}
    for key, topic in TOPICS.items():
        try:
            resolved[key] = resolve_topic(p, info.topics, topic)
        except BagError:
            if key in REQUIRED:
                raise
    by_topic = {v: k for k, v in resolved.items()}
    messages = (
        (by_topic[topic], t_ns, msg) for topic, t_ns, msg in read_messages(p, list(by_topic))
    )
    counts = {k: info.topics[v].count for k, v in resolved.items()}
    return analyze_messages(str(p), messages, counts, joint_names, config, intervention_check,
                            training_stats, intervention_source, stats_source)


def analyze_messages(
    source: str,
    messages: Iterable[tuple[str, int, Any]],
    topic_counts: dict[str, int],
    joint_names: Sequence[str],
    config: RolloutConfig,
    intervention_check: InterventionCheck | None = None,
    training_stats: TrainingStats | None = None,
    intervention_source: str = "none",
    stats_source: str = "none",
) -> BagAnalysis:
    """Feed (TOPICS key, receive time ns, message) in receive order through the shadow metrics.

    Messages are rclpy or rosbags objects alike (same field names).
    """
    names = list(joint_names)
    acc = ShadowAccumulator(names, config.metrics, intervention_check, training_stats)
    segments: list[Segment] = []
    steps: list[StepDivergence] = []
    interventions: list[WouldBeIntervention] = []
    dis: list[float] = []
    ood: list[float] = []
    transitions: list[dict[str, Any]] = []
    malformed: list[str] = []
    events = 0
    stage: str | None = None
    version: int | None = None

    def close_segment() -> None:
        acc.finish()
        interventions.extend(acc.hard_interventions)
        segments.append(Segment(stage or STAGES[0], version, acc.metrics()))
        acc.reset()

    for key, t_ns, msg in messages:
        topic = TOPICS[key]
        if key in ("policy", "baseline", "joint_states"):
            try:
                arr = joint_state_to_arrays(msg, names)
            except MessageError as exc:
                malformed.append(f"{topic} at {t_ns} ns: {exc}")
                continue
            assert arr.position is not None
            stamp = stamp_to_ns(msg.header.stamp)
            if key == "joint_states":
                acc.add_joint_state(stamp, arr.position, arr.velocity)
                continue
            step = (acc.add_policy if key == "policy" else acc.add_baseline)(stamp, arr.position)
            if step is not None:
                steps.append(step)
        elif key == "confidence":
            v = msg.vector
            acc.add_confidence(stamp_to_ns(msg.header.stamp), v.x, v.y, int(round(v.z)))
            dis.append(float(v.x))
            ood.append(float(v.y))
        elif key == "events":
            events += 1
        else:
            try:
                data = json.loads(msg.data)
            except json.JSONDecodeError:
                malformed.append(f"{topic} at {t_ns} ns: not JSON")
                continue
            if key == "transitions":
                transitions.append(data)
            elif key == "status" and isinstance(data, dict):
                new = data.get("rollout_stage")
                if new not in STAGES:
                    malformed.append(f"{topic} at {t_ns} ns: rollout_stage {new!r}")
                    continue
                acc.add_status(bool(data.get("estop", False)))
                if stage is not None and new != stage:
                    close_segment()
                stage = str(new)
            elif key == "version" and isinstance(data, dict) and "version" in data:
                new_v = int(data["version"])
                if version is not None and new_v != version:
                    close_segment()
                version = new_v
    close_segment()
    final = segments[-1]
    current = stage or STAGES[0]
    gm = final.metrics.gate_metrics()
    return BagAnalysis(
        bag=source,
        joint_names=names,
        stage=current,
        stage_known=stage is not None,
        metrics=final.metrics,
        recommendation=recommend(config, current, gm),
        all_gates={s: evaluate(config.gate_to(s), gm) for s in STAGES[1:]},
        segments=segments,
        steps=steps,
        disagreement_rad=np.asarray(dis),
        ood_score=np.asarray(ood),
        interventions=interventions,
        transitions=transitions,
        safety_events=events,
        topic_counts=topic_counts,
        intervention_source=intervention_source,
        stats_source=stats_source,
        config=config,
        malformed=malformed,
    )


# --- plots ---------------------------------------------------------------------------------


def plot_divergence(a: BagAnalysis, path: Path) -> Path:
    """Plot per-joint |policy - baseline| over time, the L2 divergence and windowed agreement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(a.joint_names)
    fig, axes = plt.subplots(n + 2, 1, figsize=(10, 1.6 * (n + 2)), sharex=True)
    tol = a.config.metrics.agreement_tolerance_rad
    if a.steps:
        t0 = a.steps[0].t_ns
        t = (np.array([s.t_ns for s in a.steps]) - t0) * 1e-9
        absd = np.stack([s.abs_rad for s in a.steps])
        for j, name in enumerate(a.joint_names):
            ax = axes[j]
            ax.plot(t, absd[:, j], lw=0.8)
            ax.axhline(tol, color="tab:red", ls="--", lw=0.8)
            ax.set_ylabel(f"{name}\nrad", fontsize=7)
        axes[n].plot(t, [s.l2_rad for s in a.steps], lw=0.8, color="k")
        axes[n].set_ylabel("L2\nrad", fontsize=7)
        ws = windows(a.steps, a.config.metrics.window_s)
        starts = [w.t_start_s - t0 * 1e-9 for w in ws]
        rates = [w.agreement_rate for w in ws]
        axes[n + 1].step(starts + [t[-1]], rates + rates[-1:], where="post")
        axes[n + 1].set_ylim(-0.05, 1.05)
        axes[n + 1].set_ylabel(f"agreement\n/{a.config.metrics.window_s:g} s", fontsize=7)
        # Hard would-be violations only: soft rate shaping is frequent and would hide them.
        for iv in a.interventions:
            if iv.hard:
                axes[n].axvline((iv.t_ns - t0) * 1e-9, color="tab:red", lw=0.6, alpha=0.6)
    else:
        axes[0].text(0.5, 0.5, "no aligned policy/baseline commands", ha="center",
                     transform=axes[0].transAxes)
    axes[-1].set_xlabel("time since first aligned step (s, header stamps)")
    fig.suptitle(f"|policy - baseline| per joint (dashed: agreement tolerance {tol:g} rad; "
                 "red lines on L2: would-be hard violations)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_confidence(a: BagAnalysis, path: Path) -> Path:
    """Plot the distributions of ensemble disagreement and OOD score with their thresholds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    m = a.config.metrics
    for ax, values, thr, label in (
        (axes[0], a.disagreement_rad, m.disagreement_threshold_rad, "ensemble disagreement, rad"),
        (axes[1], a.ood_score, m.ood_threshold, "OOD score (RMS z)"),
    ):
        finite = values[np.isfinite(values)] if values.size else values
        if finite.size:
            ax.hist(finite, bins=50, color="tab:blue", alpha=0.8)
            ax.axvline(thr, color="tab:red", ls="--", label=f"threshold {thr:g}")
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no policy/confidence messages", ha="center",
                    transform=ax.transAxes)
        ax.set_xlabel(label)
    axes[0].set_ylabel("messages")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# --- pages ---------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None:
        return "not measured"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def gate_rows(gate: GateResult) -> list[list[str]]:
    """Return the gate table as rows of text cells."""
    return [
        [c.key, _fmt(c.measured), c.op, _fmt(c.threshold), "pass" if c.passed else "FAIL"]
        for c in gate.criteria
    ]


def _tables(a: BagAnalysis) -> list[tuple[str, list[str], list[list[str]]]]:
    m = a.metrics
    out: list[tuple[str, list[str], list[list[str]]]] = []
    if a.recommendation.gate is not None:
        g = a.recommendation.gate
        out.append((f"Gate {g.from_stage} -> {g.to_stage}",
                    ["criterion", "measured", "op", "threshold", "result"], gate_rows(g)))
    out.append((
        "Divergence per joint (since the stage began)",
        ["joint", "mean abs divergence rad", "max abs divergence rad"],
        [[j, _fmt(mean), _fmt(mx)] for j, mean, mx in zip(a.joint_names, m.mean_abs_rad,
                                                          m.max_abs_rad)],
    ))
    summary = [
        ["aligned steps", _fmt(m.steps)], ["observed time s", _fmt(m.time_s)],
        ["agreement rate", _fmt(m.agreement_rate)], ["mean L2 rad", _fmt(m.mean_l2_rad)],
        ["p95 L2 rad", _fmt(m.l2_percentiles_rad.get("p95"))],
        ["max L2 rad", _fmt(m.max_l2_rad)],
        ["policy commands without baseline partner", _fmt(m.unmatched_policy)],
        ["baseline commands without policy partner", _fmt(m.unmatched_baseline)],
        ["would-be hard violations", _fmt(m.hard_violations)],
        ["would-be soft interventions", _fmt(m.soft_interventions)],
        ["would-be interventions by kind", json.dumps(m.interventions_by_kind)],
        ["e-stops", _fmt(m.estops)],
        ["coverage (within k sigma)",
         _fmt(None if m.coverage is None else m.coverage.fraction_within)],
    ]
    out.append(("Summary", ["metric", "value"], summary))
    conf = [["disagreement rad", *[_fmt(m.disagreement_percentiles_rad.get(k))
                                   for k in ("p50", "p90", "p95", "p99", "max")]],
            ["OOD score", *[_fmt(m.ood_percentiles.get(k))
                            for k in ("p50", "p90", "p95", "p99", "max")]]]
    out.append((f"Confidence ({m.confidence_samples} messages; OOD fraction "
                f"{_fmt(m.ood_fraction)}, fallback rate {_fmt(m.fallback_rate)})",
                ["", "p50", "p90", "p95", "p99", "max"], conf))
    out.append(("All gates against this evidence", ["gate", "passed", "failing criteria"],
                [[f"{g.from_stage} -> {g.to_stage}", "yes" if g.passed else "no",
                  ", ".join(c.key for c in g.failing()) or "-"]
                 for g in a.all_gates.values()]))
    if a.segments[:-1]:
        out.append(("Earlier segments (evidence restarts at each stage or version change)",
                    ["stage", "policy version", "steps", "agreement rate"],
                    [[s.stage, _fmt(s.version), _fmt(s.metrics.steps),
                      _fmt(s.metrics.agreement_rate)] for s in a.segments[:-1]]))
    if a.transitions:
        out.append(("Stage transitions recorded in the bag",
                    ["from", "to", "kind", "who", "why"],
                    [[str(t.get("from")), str(t.get("to")), str(t.get("kind")),
                      str(t.get("who")), str(t.get("why"))] for t in a.transitions]))
    return out


def _header_lines(a: BagAnalysis) -> list[str]:
    rec = a.recommendation
    verdict = (f"promote to **{rec.recommended_stage}** (gate passed)" if rec.promote
               else f"stay at **{rec.current_stage}**"
               + ("" if rec.gate is None else " (gate not passed)"))
    return [
        f"- Source: `{a.bag}`; messages: {json.dumps(a.topic_counts)}",
        f"- Stage: **{a.stage}**" + ("" if a.stage_known else
                                     " (assumed: no safety_filter/status in the bag)"),
        f"- Recommendation: {verdict}",
        f"- Would-be interventions checked with: {a.intervention_source}",
        f"- Coverage reference: {a.stats_source}",
        f"- Rollout config: `{a.config.path}`",
    ]


def render_markdown(a: BagAnalysis, images: dict[str, str]) -> str:
    """Return the report as markdown."""
    lines = ["# Shadow report", "", *_header_lines(a), ""]
    tables = _tables(a)
    for i, (title, head, rows) in enumerate(tables):
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |",
                  "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.append("")
        if i == 0:
            lines += ["## Divergence over time", "", f"![divergence]({images['divergence']})",
                      "", "## Confidence distribution", "",
                      f"![confidence]({images['confidence']})", ""]
    return "\n".join(lines)


def render_html(a: BagAnalysis, images: dict[str, str]) -> str:
    """Return the report as a self-describing HTML page (images alongside)."""
    import re

    def inline(s: str) -> str:
        s = html.escape(s)
        s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", s)

    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>Shadow report</title>",
             "<style>body{font-family:sans-serif;max-width:60em}td,th{border:1px solid #ccc;"
             "padding:2px 6px}table{border-collapse:collapse}</style></head><body>",
             "<h1>Shadow report</h1><ul>"]
    parts += [f"<li>{inline(line[2:])}</li>" for line in _header_lines(a)]
    parts.append("</ul>")
    for i, (title, head, rows) in enumerate(_tables(a)):
        parts.append(f"<h2>{html.escape(title)}</h2><table><tr>"
                     + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                  for r in rows]
        parts.append("</table>")
        if i == 0:
            parts.append(f"<h2>Divergence over time</h2><img src='{images['divergence']}'>"
                         f"<h2>Confidence distribution</h2><img src='{images['confidence']}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(a: BagAnalysis, out_dir: str | Path, fmt: str = "md") -> Path:
    """Write report.json, the plots and report.md or report.html; return the page's path."""
    if fmt not in ("md", "html"):
        raise ConfigError(None, "--format", fmt, "md or html")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images = {"divergence": "divergence.png", "confidence": "confidence.png"}
    plot_divergence(a, out / images["divergence"])
    plot_confidence(a, out / images["confidence"])
    (out / "report.json").write_text(json.dumps(a.as_dict(), indent=1, default=json_default))
    page = out / f"report.{fmt}"
    page.write_text(render_markdown(a, images) if fmt == "md" else render_html(a, images))
    return page
