"""The CI gate's outputs: a paragraph of text, markdown for a CI job summary, JUnit XML."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Protocol
from xml.sax.saxutils import escape, quoteattr

from ..session.check import ERROR, INCONCLUSIVE, NO_BASELINE, REGRESSION, CheckResult
from .check_words import check_paragraph
from .comparison_words import to_dict as comparison_dict
from .text import format_value

_ICON = {
    "pass": "\u2705",
    REGRESSION: "\u274c",
    INCONCLUSIVE: "\u2754",
    NO_BASELINE: "\u26a0\ufe0f",
    ERROR: "\u26a0\ufe0f",
}


class GateResult(Protocol):
    """What a gate's report needs of its result: the exit code (0/1/2/3 as the CLI exits) and
    its data (``to_dict()``)."""

    @property
    def exit_code(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


class GateReport:
    """What the reports of the CI gates (``check``, ``check --history``, ``ab``) share: a
    ``result`` with ``exit_code`` (0/1/2/3 as the CLI exits) and ``to_dict()``; each subclass
    writes its ``text()``, ``markdown()`` and ``junit()``."""

    result: GateResult

    @property
    def exit_code(self) -> int:
        code: int = self.result.exit_code
        return code

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    def text(self) -> str:
        raise NotImplementedError

    def markdown(self) -> str:
        raise NotImplementedError

    def junit(self) -> str:
        raise NotImplementedError

    def write_junit(self, path: str | os.PathLike[str]) -> str:
        """Write :meth:`junit` to ``path`` atomically; returns the absolute path."""
        target = os.path.abspath(os.fspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".traceml-junit-", dir=os.path.dirname(target))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(self.junit())
        os.replace(tmp, target)
        return target

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = self.result.to_dict()
        return data

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return self.text()


@dataclass(repr=False)
class CheckReport(GateReport):
    """What ``traceml_nb.check(...)`` returns: the :class:`~traceml_nb.session.check.
    CheckResult` (``result``) and its renderings. ``exit_code`` 0/1/2/3 as the CLI exits."""

    result: CheckResult

    def text(self) -> str:
        """The one-paragraph verdict (:func:`~.check_words.check_paragraph`)."""
        return check_paragraph(self.result)

    def to_dict(self) -> dict[str, Any]:
        """The result's data, with the verdict paragraph and the comparison's headline."""
        data = self.result.to_dict()
        data["verdict"] = self.text()
        if self.result.comparison is not None:
            data["comparison"] = comparison_dict(self.result.comparison)
        return data

    def markdown(self) -> str:
        """A heading, the verdict, and the comparison table (for a CI job summary)."""
        r = self.result
        lines = [
            f"### {_ICON.get(r.status, '')} traceml_nb check: `{r.name}` \u2014 {r.status}",
            "",
        ]
        lines += [self.text(), ""]
        if r.job is not None:
            lines += [f"**Job** `{r.job.job_id}`: {r.job.ranks_line()}", ""]
        comparison = r.comparison
        if comparison is not None and comparison.rows:
            lines += ["| | baseline | latest | change |", "|---|---|---|---|"]
            for label, before, after, delta, _direction in comparison.rows:
                cells = [label, format_value(before), format_value(after), format_value(delta)]
                lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            lines.append("")
        if r.changes:
            lines += ["**What changed**", ""] + [f"- {line}" for line in r.changes] + [""]
        return "\n".join(lines)

    def junit(self) -> str:
        """JUnit XML: one test case named after the run; a failure for a regression, a skip for
        no baseline yet and for an inconclusive verdict, an error for an unreadable store or a
        usage error."""
        r = self.result
        verdict = self.text()
        body = ""
        message = quoteattr(verdict)
        if r.status == REGRESSION:
            body = f'<failure message={message} type="regression">{escape(verdict)}</failure>'
        elif r.status in (NO_BASELINE, INCONCLUSIVE):
            body = f"<skipped message={message}/>"
        elif r.status == ERROR:
            body = f'<error message={message} type="store">{escape(verdict)}</error>'
        counts = {
            "failures": int(r.status == REGRESSION),
            "errors": int(r.status == ERROR),
            "skipped": int(r.status in (NO_BASELINE, INCONCLUSIVE)),
        }
        attrs = " ".join(f'{k}="{v}"' for k, v in counts.items())
        case = quoteattr(r.name)
        if r.job is not None:  # first in the test case, as pytest writes its properties
            job = r.job.to_dict()
            ranks = " ".join(f"@{i}" for i in job["ids"])
            values = {"job_id": job["job_id"], "ranks": ranks, "slowest_rank": job["slowest_rank"]}
            props = "".join(
                f"<property name={quoteattr(k)} value={quoteattr(str(v))}/>"
                for k, v in values.items()
                if v is not None
            )
            body = f"<properties>{props}</properties>{body}"
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuites><testsuite name="traceml_nb check" tests="1" {attrs}>'
            f'<testcase classname="traceml_nb.check" name={case}>{body}'
            f"<system-out>{escape(verdict)}</system-out></testcase></testsuite></testsuites>\n"
        )
