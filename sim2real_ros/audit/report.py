"""The audit's two outputs: a markdown page for people and a JSON record for gates and tools."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sim2real_ros.audit.checklist import RED, Checklist
from sim2real_ros.audit.evidence import AuditEvidence

FORMAT = "sim2real_audit/1"
_BADGE = {"green": "🟢 green", "amber": "🟠 amber", "red": "🔴 red"}


def to_json(checklist: Checklist, ev: AuditEvidence, inputs: dict[str, Any],
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return the JSON record of an audit."""
    return {
        "format": FORMAT,
        "created_utc": checklist.now_utc,
        "overall": checklist.overall,
        "deployable": checklist.deployable,
        "units": ev.units(),
        "rows": [r.to_dict() for r in checklist.rows],
        "thresholds": asdict(checklist.thresholds),
        "inputs": inputs,
        "measurements": {
            "latency": [asdict(m) for m in ev.latency],
            "noise": [asdict(m) for m in ev.measured_noise],
        },
        "world_model": asdict(ev.world_model) if ev.world_model is not None else None,
        "notes": list(ev.notes),
        **(extra or {}),
    }


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(checklist: Checklist, ev: AuditEvidence, inputs: dict[str, Any]) -> str:
    """Return the human report: verdict, the six-row table, evidence and missing mitigations."""
    verdict = ("**NOT deployable: a row is red.**" if not checklist.deployable else
               "Deployable; amber rows need a planned mitigation." if checklist.overall != "green"
               else "Deployable: every row is green.")
    lines = [
        "# Reality-gap audit",
        "",
        f"- created: {checklist.now_utc}",
        f"- unit: {', '.join(f'{u} ({s})' for s, u in ev.units().items()) or 'not declared'}",
        f"- overall: {_BADGE[checklist.overall]} — {verdict}",
        "",
        "| gap | status | rule | mitigation still missing |",
        "|---|---|---|---|",
    ]
    for r in checklist.rows:
        missing = "; ".join(r.missing) if r.missing else "—"
        lines.append(f"| {r.title} | {_BADGE[r.status]} | {_cell(r.rule)} | {_cell(missing)} |")
    lines += ["", "## Evidence per row", ""]
    for r in checklist.rows:
        lines.append(f"### {r.title}: {r.status}" + (" (blocks deployment)" if r.status == RED
                                                       else ""))
        lines.append("")
        lines.append(f"Rule: {r.rule}")
        lines.append("")
        lines += [f"- {e}" for e in r.evidence] or ["- (no evidence)"]
        if r.missing:
            lines += ["", "Missing:"] + [f"- {m}" for m in r.missing]
        lines.append("")
    lines += ["## Inputs", ""]
    for key, value in inputs.items():
        lines.append(f"- {key}: {json.dumps(value) if not isinstance(value, str) else value}")
    if ev.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in ev.notes]
    lines += ["", "## Thresholds", ""]
    lines += [f"- {k}: {v}" for k, v in asdict(checklist.thresholds).items()]
    return "\n".join(lines) + "\n"


def write_report(out_dir: str | Path, checklist: Checklist, ev: AuditEvidence,
                 inputs: dict[str, Any], extra: dict[str, Any] | None = None
                 ) -> tuple[Path, Path]:
    """Write audit.md and audit.json into `out_dir`; return both paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    md = d / "audit.md"
    js = d / "audit.json"
    md.write_text(to_markdown(checklist, ev, inputs))
    js.write_text(json.dumps(to_json(checklist, ev, inputs, extra), indent=2, default=str) + "\n")
    return md, js
