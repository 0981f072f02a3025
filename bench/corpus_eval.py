"""Recall and wrong findings of `detaudit check` on the labelled real-code corpus.

The corpus (``bench/corpus/corpus.toml``) names public training codebases at
pinned commits and the files a user would check in each; the labels
(``bench/corpus/labels.jsonl``) say, from reading that code, where
reproducibility breaks (``"hazard": true``, the default) and which look-alikes a
rule must leave alone (``"hazard": false``).  This script runs the current
``detaudit check --format json`` on every repository's files (from the
repository's root, as its users would), matches the findings to the labels and
prints, per rule: findings, true, wrong (labelled not a hazard), unlabelled,
labelled hazards, found, recall, missed; then totals, wrong findings per 20
files, and every wrong finding, miss and unlabelled finding.

    python bench/corpus_eval.py CORPUS_ROOT [--json | --skeletons | --clone-commands] [--repo NAME ...]

CORPUS_ROOT holds one checkout per repository (``CORPUS_ROOT/<dir>``, ``dir``
defaulting to ``name``) at the pinned commit; no network is used here.  How to
bring them is in ``bench/corpus/README.md``.

Matching.  A finding matches a label with the same repository, path and kind
(the rule name) whose line span (``line`` .. ``end_line``) is within
``--tolerance`` lines of the finding's line; a label with ``"scope": "file"``
matches that rule's finding anywhere in the file (missing seeds, determinism
never requested: one cause per script wherever the tool puts it).  The closest
label wins.  Labels sharing a ``group`` in one file are one hazard (one op
called at several sites, one cause): a true finding on any member finds it.
A finding is "wrong" only when it matches a ``"hazard": false`` label someone
wrote after reading the code; a finding matching no label is "unlabelled" and
listed so it gets labelled.  A repository with ``rules = [...]`` in the corpus
was labelled for those rules only: other rules' findings there are not counted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "bench" / "corpus" / "corpus.toml"
LABELS = REPO / "bench" / "corpus" / "labels.jsonl"
LABEL_FIELDS = {"repo", "commit", "path", "line", "kind", "note", "hazard", "end_line", "scope", "group"}


class CorpusError(Exception):
    """The corpus, the labels or a checkout cannot be used (one line, shown as is)."""


@dataclass(frozen=True)
class Repo:
    name: str
    url: str
    commit: str
    files: tuple[str, ...]
    dir: str
    #: the rules this repository was labelled for (empty: every rule); findings of other rules are not counted
    rules: tuple[str, ...] = ()
    #: "tuned": the rules were tuned on it; "unseen", "unseen-2": batches added (and labelled before
    #: detaudit ran on them) to measure how the rules carry to code they were not tuned on.  A batch's
    #: first figure is that measure; once rules change for its misses, it is tuned on like the rest.
    set: str = "tuned"


@dataclass(frozen=True)
class Label:
    number: int  # line in labels.jsonl, for messages
    repo: str
    path: str
    line: int
    kind: str
    note: str
    hazard: bool
    end_line: int
    file_scope: bool
    group: str | None

    def distance(self, line: int) -> int:
        if self.file_scope or self.line <= line <= self.end_line:
            return 0
        return min(abs(line - self.line), abs(line - self.end_line))

    @property
    def unit(self) -> tuple:
        """The hazard this label counts towards: its group, or itself."""
        return (self.repo, self.path, self.kind, self.group) if self.group else ("label", self.number)


@dataclass
class Finding:
    repo: str
    path: str
    line: int
    rule: str
    code: str
    severity: str
    message: str
    label: Label | None = None

    @property
    def verdict(self) -> str:
        if self.label is None:
            return "unlabelled"
        return "true" if self.label.hazard else "wrong"


@dataclass
class RuleRow:
    findings: int = 0
    true: int = 0
    wrong: int = 0
    unlabelled: int = 0
    hazards: int = 0
    found: int = 0

    @property
    def missed(self) -> int:
        return self.hazards - self.found

    def recall(self) -> float | None:
        return self.found / self.hazards if self.hazards else None


@dataclass
class Evaluation:
    detaudit_commit: str
    date: str
    repos: list[str]
    files_checked: int
    rows: dict[str, RuleRow]
    findings: list[Finding]
    misses: list[list[Label]]  # each: the labels of one missed hazard
    errors: list[str] = field(default_factory=list)


# -- loading -----------------------------------------------------------------------


#: The corpus sets, in the order they were added.
SETS = ("tuned", "unseen", "unseen-2")


def load_corpus(path: Path) -> list[Repo]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise CorpusError(f"{path}: {error}") from None
    repos = []
    for entry in data.get("repo", []):
        missing = {"name", "url", "commit", "files"} - entry.keys()
        if missing:
            raise CorpusError(f"{path}: repo {entry.get('name', '?')} lacks {', '.join(sorted(missing))}")
        repos.append(
            Repo(
                entry["name"], entry["url"], entry["commit"], tuple(entry["files"]), entry.get("dir", entry["name"]),
                tuple(entry.get("rules", ())), entry.get("set", "tuned"),
            )
        )
    unknown = {r.set for r in repos} - set(SETS)
    if unknown:
        raise CorpusError(f"{path}: unknown set {', '.join(sorted(unknown))} (known: {', '.join(SETS)})")
    names = [r.name for r in repos]
    if len(set(names)) != len(names):
        raise CorpusError(f"{path}: a repo name is used twice")
    return repos


def load_labels(path: Path, repos: list[Repo]) -> list[Label]:
    by_name = {r.name: r for r in repos}
    labels = []
    seen: dict[tuple, Label] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise CorpusError(f"{where}: not JSON ({error})") from None
        unknown = raw.keys() - LABEL_FIELDS
        missing = {"repo", "commit", "path", "line", "kind", "note"} - raw.keys()
        if unknown or missing:
            raise CorpusError(f"{where}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        repo = by_name.get(raw["repo"])
        if repo is None:
            raise CorpusError(f"{where}: repo {raw['repo']!r} is not in the corpus")
        if raw["commit"] != repo.commit:
            raise CorpusError(f"{where}: written against {raw['commit'][:12]}, the corpus pins {repo.commit[:12]}")
        if raw["path"] not in repo.files:
            raise CorpusError(f"{where}: {raw['path']} is not one of {repo.name}'s checked files")
        scope = raw.get("scope", "line")
        if scope not in ("line", "file"):
            raise CorpusError(f"{where}: scope must be 'line' or 'file'")
        label = Label(
            number=number,
            repo=raw["repo"],
            path=raw["path"],
            line=int(raw["line"]),
            kind=raw["kind"],
            note=raw["note"],
            hazard=bool(raw.get("hazard", True)),
            end_line=int(raw.get("end_line", raw["line"])),
            file_scope=scope == "file",
            group=raw.get("group"),
        )
        if label.end_line < label.line:
            raise CorpusError(f"{where}: end_line comes before line")
        if label.group and not label.hazard:
            raise CorpusError(f"{where}: a 'not a hazard' label takes no group")
        key = (label.repo, label.path, label.line, label.kind)
        if key in seen:
            raise CorpusError(f"{where}: same place and kind as line {seen[key].number}")
        seen[key] = label
        labels.append(label)
    return labels


# -- running detaudit ----------------------------------------------------------------


def git_head(directory: Path) -> str | None:
    result = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


def detaudit_version() -> str:
    """The last commit that changed detaudit/ (the code measured), and whether it has local edits."""
    log = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%H", "--", "detaudit"], capture_output=True, text=True)
    head = log.stdout.strip() or "unknown"
    status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "detaudit"], capture_output=True, text=True)
    return head + ("+uncommitted" if status.stdout.strip() else "")


def check_repo(repo: Repo, root: Path) -> tuple[int, list[Finding]]:
    """(files checked, findings) of the current detaudit on the repo's files."""
    checkout = root / repo.dir
    if not checkout.is_dir():
        raise CorpusError(f"{repo.name}: no checkout at {checkout} (see bench/corpus/README.md)")
    head = git_head(checkout)
    if head is not None and head != repo.commit:
        raise CorpusError(f"{repo.name}: {checkout} is at {head[:12]}, the labels are for {repo.commit[:12]}")
    absent = [f for f in repo.files if not (checkout / f).is_file()]
    if absent:
        raise CorpusError(f"{repo.name}: missing in the checkout: {', '.join(absent)}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "detaudit", "check", "--format", "json", "--no-cache", "--no-config", "--exit-zero", *repo.files]
    result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise CorpusError(f"{repo.name}: detaudit exited {result.returncode}: {result.stderr.strip()[-500:]}")
    report = json.loads(result.stdout)
    findings = [
        Finding(repo.name, Path(f["path"]).as_posix(), f["line"], f["name"], f["code"], f["severity"], f["message"])
        for f in report["findings"]
        if not repo.rules or f["name"] in repo.rules
    ]
    return report["files_checked"], findings


def stale_labels(repo: Repo, root: Path, labels: list[Label]) -> list[str]:
    """Labels whose line lies past the end of their file: written against other contents."""
    lengths: dict[str, int] = {}
    stale = []
    for label in labels:
        if label.repo != repo.name:
            continue
        if label.path not in lengths:
            text = (root / repo.dir / label.path).read_text(encoding="utf-8", errors="replace")
            lengths[label.path] = len(text.splitlines())
        if label.end_line > lengths[label.path]:
            stale.append(f"labels.jsonl:{label.number}: {repo.name}:{label.path} has {lengths[label.path]} lines, the label points at {label.end_line}")
    return stale


# -- matching ------------------------------------------------------------------------


def match(findings: list[Finding], labels: list[Label], tolerance: int) -> list[list[Label]]:
    """Attach each finding to its closest label; return the missed hazards."""
    by_place: dict[tuple, list[Label]] = defaultdict(list)
    for label in labels:
        by_place[(label.repo, label.path, label.kind)].append(label)
    for finding in findings:
        candidates = [
            (label.distance(finding.line), label.file_scope, label.line, label)
            for label in by_place[(finding.repo, finding.path, finding.rule)]
            if label.distance(finding.line) <= tolerance
        ]
        if candidates:
            finding.label = min(candidates, key=lambda c: c[:3])[3]
    found_units = {f.label.unit for f in findings if f.label is not None and f.label.hazard}
    units: dict[tuple, list[Label]] = defaultdict(list)
    for label in labels:
        if label.hazard:
            units[label.unit].append(label)
    return [members for unit, members in units.items() if unit not in found_units]


def evaluate(repos: list[Repo], labels: list[Label], root: Path, tolerance: int) -> Evaluation:
    findings: list[Finding] = []
    files_checked = 0
    errors = []
    checked_repos = []
    for repo in repos:
        try:
            count, repo_findings = check_repo(repo, root)
        except CorpusError as error:
            errors.append(str(error))
            continue
        files_checked += count
        findings.extend(repo_findings)
        checked_repos.append(repo.name)
        errors.extend(stale_labels(repo, root, labels))
    labels = [label for label in labels if label.repo in checked_repos]
    misses = match(findings, labels, tolerance)

    rows: dict[str, RuleRow] = defaultdict(RuleRow)
    for finding in findings:
        row = rows[finding.rule]
        row.findings += 1
        setattr(row, finding.verdict, getattr(row, finding.verdict) + 1)
    units: dict[tuple, str] = {label.unit: label.kind for label in labels if label.hazard}
    missed_units = {members[0].unit for members in misses}
    for unit, kind in units.items():
        rows[kind].hazards += 1
        rows[kind].found += unit not in missed_units
    return Evaluation(
        detaudit_commit=detaudit_version(),
        date=datetime.date.today().isoformat(),
        repos=checked_repos,
        files_checked=files_checked,
        rows=dict(sorted(rows.items())),
        findings=findings,
        misses=sorted(misses, key=lambda m: (m[0].kind, m[0].repo, m[0].path, m[0].line)),
        errors=errors,
    )


# -- output --------------------------------------------------------------------------


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def totals(evaluation: Evaluation) -> RuleRow:
    total = RuleRow()
    for row in evaluation.rows.values():
        for name in ("findings", "true", "wrong", "unlabelled", "hazards", "found"):
            setattr(total, name, getattr(total, name) + getattr(row, name))
    return total


def wrong_per_20_files(evaluation: Evaluation) -> float:
    return 20 * totals(evaluation).wrong / evaluation.files_checked if evaluation.files_checked else 0.0


def render_text(evaluation: Evaluation) -> str:
    lines = [
        f"detaudit {evaluation.detaudit_commit} on {len(evaluation.repos)} repositories, "
        f"{evaluation.files_checked} files ({evaluation.date})",
        "",
    ]
    header = ("rule", "findings", "true", "wrong", "unlabelled", "hazards", "found", "recall", "missed")
    table = [header]
    for name, row in [*evaluation.rows.items(), ("TOTAL", totals(evaluation))]:
        table.append((name, row.findings, row.true, row.wrong, row.unlabelled, row.hazards, row.found, _percent(row.recall()), row.missed))
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    for row in table:
        cells = [str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(row)]
        lines.append("  ".join(cells))
    total = totals(evaluation)
    lines += [
        "",
        f"recall {_percent(total.recall())} ({total.found}/{total.hazards} labelled hazards); "
        f"wrong findings {total.wrong} in {evaluation.files_checked} files = {wrong_per_20_files(evaluation):.2f} per 20 files; "
        f"unlabelled {total.unlabelled}",
    ]
    wrong = [f for f in evaluation.findings if f.verdict == "wrong"]
    if wrong:
        lines += ["", f"WRONG FINDINGS ({len(wrong)})"]
        for f in wrong:
            lines.append(f"  {f.repo}:{f.path}:{f.line} {f.rule}: {f.message}")
            lines.append(f"      not a hazard (labels.jsonl:{f.label.number}): {f.label.note}")
    if evaluation.misses:
        lines += ["", f"MISSED HAZARDS ({len(evaluation.misses)})"]
        for members in evaluation.misses:
            first = members[0]
            where = ",".join(str(m.line) for m in members)
            scope = " (file)" if first.file_scope else ""
            lines.append(f"  {first.repo}:{first.path}:{where}{scope} {first.kind}: {first.note} (labels.jsonl:{first.number})")
    unlabelled = [f for f in evaluation.findings if f.verdict == "unlabelled"]
    if unlabelled:
        lines += ["", f"UNLABELLED FINDINGS ({len(unlabelled)}): read the code and add a label"]
        for f in unlabelled:
            lines.append(f"  {f.repo}:{f.path}:{f.line} {f.rule}: {f.message}")
    for error in evaluation.errors:
        lines.append(f"error: {error}")
    return "\n".join(lines)


def render_json(evaluation: Evaluation) -> str:
    def finding(f: Finding) -> dict:
        out = {"repo": f.repo, "path": f.path, "line": f.line, "rule": f.rule, "code": f.code, "message": f.message, "verdict": f.verdict}
        if f.label is not None:
            out["label"] = f.label.number
        return out

    def row(r: RuleRow) -> dict:
        return {
            "findings": r.findings, "true": r.true, "wrong": r.wrong, "unlabelled": r.unlabelled,
            "hazards": r.hazards, "found": r.found, "missed": r.missed, "recall": r.recall(),
        }

    return json.dumps(
        {
            "detaudit_commit": evaluation.detaudit_commit,
            "date": evaluation.date,
            "repos": evaluation.repos,
            "files_checked": evaluation.files_checked,
            "rules": {name: row(r) for name, r in evaluation.rows.items()},
            "total": row(totals(evaluation)),
            "wrong_per_20_files": wrong_per_20_files(evaluation),
            "findings": [finding(f) for f in evaluation.findings],
            "missed": [
                {"repo": m[0].repo, "path": m[0].path, "lines": [x.line for x in m], "kind": m[0].kind, "note": m[0].note, "labels": [x.number for x in m]}
                for m in evaluation.misses
            ],
            "errors": evaluation.errors,
        },
        indent=2,
    )


def render_skeletons(evaluation: Evaluation, repos: list[Repo]) -> str:
    """One label line per unlabelled finding, to fill in (note, and "hazard": false where it is not one)."""
    commits = {r.name: r.commit for r in repos}
    return "\n".join(
        json.dumps({"repo": f.repo, "commit": commits[f.repo], "path": f.path, "line": f.line, "kind": f.rule, "note": ""})
        for f in evaluation.findings
        if f.verdict == "unlabelled"
    )


def render_clone_commands(repos: list[Repo], root: Path) -> str:
    """Shell commands that bring every checkout to ROOT at its pinned commit (they need the network)."""
    lines = []
    for repo in repos:
        target = root / repo.dir
        lines.append(f"git clone -q --no-checkout {repo.url} {target} && git -C {target} checkout -q {repo.commit}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="directory holding one checkout per corpus repository")
    parser.add_argument("--json", action="store_true", help="print the evaluation as JSON")
    parser.add_argument("--repo", action="append", default=[], help="only this repository (repeatable)")
    parser.add_argument("--clone-commands", action="store_true", help="print the git commands that bring the checkouts to ROOT, and exit")
    parser.add_argument("--skeletons", action="store_true", help="print a label line to fill in for every unlabelled finding")
    parser.add_argument("--tolerance", type=int, default=2, help="lines a finding may be off its label (default 2)")
    parser.add_argument("--set", choices=SETS, help="only the repositories of this set (unseen, unseen-2: batches labelled before the rules ran on them)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--labels", type=Path, default=LABELS)
    options = parser.parse_args(argv)
    try:
        repos = load_corpus(options.corpus)
        unknown = set(options.repo) - {r.name for r in repos}
        if unknown:
            raise CorpusError(f"not in the corpus: {', '.join(sorted(unknown))}")
        labels = load_labels(options.labels, repos) if options.labels.exists() else []
        if options.repo:
            repos = [r for r in repos if r.name in options.repo]
        if options.set:
            repos = [r for r in repos if r.set == options.set]
    except CorpusError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if options.clone_commands:
        print(render_clone_commands(repos, options.root))
        return 0
    evaluation = evaluate(repos, labels, options.root, options.tolerance)
    if options.skeletons:
        print(render_skeletons(evaluation, repos))
    else:
        print(render_json(evaluation) if options.json else render_text(evaluation))
    return 2 if evaluation.errors else 0


if __name__ == "__main__":
    sys.exit(main())
