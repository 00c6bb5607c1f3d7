"""The documentation cannot drift from the code (issue 36).

Fast tests, no sandbox: the generated reference pages are what the code says
now, every model field is described, the sample cluster file sets every key,
every YAML example loads, every relative link and anchor resolves, and the
README stays short with its test command the one CI runs. The README's
shell blocks run on the sandbox in tests/test_readme_sandbox.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import doctools
import pytest
import yaml
from clitools import cvs_in_process
from doctools import NOT_RUN, NOT_VALIDATED, README, ROOT, fenced_blocks, readme_shell_blocks
from pydantic import BaseModel, Field

from orchestrator import docsgen
from orchestrator.config import ConfigError, load_cluster
from orchestrator.config.model import ClusterConfig
from orchestrator.suites.model import Suite, suite_from_data

SAMPLE = ROOT / "cluster_samples" / "two_node.yaml"
# Keys the sample leaves out on purpose, each with the reason.
NOT_IN_SAMPLE = {"hosts[].gpu_device_root": "the sandbox's and the tests' stand-in GPUs only"}


def pages() -> list[Path]:
    return sorted(
        [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "cluster_samples" / "README.md"]
    )


# ---- generated references ---------------------------------------------------------


def test_generated_reference_pages_are_what_the_code_says() -> None:
    stale = docsgen.stale_pages(ROOT)
    assert stale == [], f"{stale}: run `python -m orchestrator.docsgen` and commit the result"


def test_every_model_field_has_a_description() -> None:
    missing = docsgen.undocumented_fields(ClusterConfig, Suite)
    assert missing == [], f"fields without Field(description=...): {', '.join(missing)}"


def test_a_field_without_a_description_is_named_by_the_check() -> None:
    class Inner(BaseModel):
        said: int = Field(default=1, description="it says")
        silent: int = 2

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="a mapping")

    assert docsgen.undocumented_fields(Outer) == ["Inner.silent"]


def test_the_check_names_a_stale_page_and_writing_fixes_it(tmp_path: Path) -> None:
    for rel in docsgen.PAGES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    page = tmp_path / "docs" / "cli.md"
    page.write_text(page.read_text().replace("### cvs exec", "### cvs exce"))
    assert docsgen.stale_pages(tmp_path) == ["docs/cli.md"]
    assert docsgen.write_pages(tmp_path) == ["docs/cli.md"]
    assert docsgen.stale_pages(tmp_path) == []
    assert page.read_text() == (ROOT / "docs" / "cli.md").read_text()


def test_the_reference_names_every_key_and_every_option() -> None:
    cluster_page = (ROOT / "docs" / "cluster-file.md").read_text()
    for key in docsgen.key_paths(ClusterConfig):
        assert f"| `{key}` |" in cluster_page, key
    cli_page = (ROOT / "docs" / "cli.md").read_text()
    for option in ("--hosts-from", "--no-check-files", "--reprovision", "--from-host", "--egress"):
        assert f"`{option}`" in cli_page, option


def test_the_regeneration_command_runs_as_development_md_says() -> None:
    assert "python -m orchestrator.docsgen" in (ROOT / "docs" / "development.md").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.docsgen", "--check", "--root", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


# ---- the sample cluster file ------------------------------------------------------


def switched_on(text: str) -> str:
    """The sample with its commented-out `# key: value` lines made live."""
    return re.sub(r"^(\s*)# ([a-z_]+: )", r"\1\2", text, flags=re.MULTILINE)


def keys_in(data: Any, prefix: str = "") -> set[str]:
    found: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            found.add(path)
            found |= keys_in(value, path)
    elif isinstance(data, list):
        for item in data:
            found |= keys_in(item, f"{prefix}[]")
    return found


# Mappings whose keys are the user's (variable names, ulimit names), and a
# mapping documented once under another path (docs/cluster-file.md, `limits`).
FREE_FORM = ("env.", "container.env.", "container.ulimits.")
SAME_KEYS = {"hosts[].limits.": "limits."}


def model_path(path: str) -> str | None:
    if path.startswith(FREE_FORM):
        return None
    for prefix, documented in SAME_KEYS.items():
        if path.startswith(prefix):
            return documented + path.removeprefix(prefix)
    return path


def test_the_sample_cluster_file_sets_every_key_of_the_model() -> None:
    written = keys_in(yaml.safe_load(switched_on(SAMPLE.read_text())))
    paths = {p for p in map(model_path, written) if p is not None}
    missing = docsgen.key_paths(ClusterConfig) - paths - set(NOT_IN_SAMPLE)
    assert missing == set(), f"cluster_samples/two_node.yaml lacks {sorted(missing)}"
    assert paths <= docsgen.key_paths(ClusterConfig), paths - docsgen.key_paths(ClusterConfig)


def test_the_sample_loads_as_it_is_and_with_its_commented_keys_on(tmp_path: Path) -> None:
    load_cluster(SAMPLE, check_files=False)
    on = tmp_path / "two_node_on.yaml"
    on.write_text(switched_on(SAMPLE.read_text()))
    load_cluster(on, check_files=False)


# ---- examples ------------------------------------------------------------------------


def yaml_examples() -> list[Any]:
    params = []
    for page in pages():
        for line, before, body in fenced_blocks(page.read_text(), "yaml"):
            rel = page.relative_to(ROOT)
            params.append(pytest.param(page, before, body, id=f"{rel}:{line}"))
    return params


@pytest.mark.parametrize(("page", "before", "body"), yaml_examples())
def test_every_yaml_example_loads(page: Path, before: str, body: str, tmp_path: Path) -> None:
    if NOT_VALIDATED.search(before):
        return
    data = yaml.safe_load(body)
    assert isinstance(data, dict), "a YAML example is a whole file, or marked not-validated"
    if "steps" in data:
        suite_from_data(data, f"{page.name} example")
        return
    path = tmp_path / "cluster.yaml"
    path.write_text(body)
    out = cvs_in_process("validate", "--no-check-files", cluster=path)
    assert out.returncode == 0, out.stderr


def test_a_broken_example_fails_validation(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("hosts: [a]\ncontainer: {image: x, lifetime: forever}\n")
    with pytest.raises(ConfigError):
        load_cluster(path, check_files=False)


# ---- links ---------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def links() -> list[Any]:
    params = []
    for page in pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for m in LINK.finditer(text):
            target = m.group("target")
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:: not ours to check offline
            params.append(pytest.param(page, target, id=f"{page.relative_to(ROOT)}->{target}"))
    return params


@pytest.mark.parametrize(("page", "target"), links())
def test_every_relative_link_resolves(page: Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), f"{page.relative_to(ROOT)}: no such file {path}"
    if anchor:
        assert dest.suffix == ".md", target
        assert anchor in anchors(dest), f"{page.relative_to(ROOT)}: no heading #{anchor} in {path}"


def test_the_link_check_sees_a_dead_anchor() -> None:
    assert "fleet-scale" in anchors(ROOT / "docs" / "performance.md")
    assert "no-such-heading" not in anchors(ROOT / "docs" / "performance.md")
    assert slug(" `cvs sandbox up`") == "cvs-sandbox-up"
    assert (
        slug(" Sharing a cluster: locks and ownership") == "sharing-a-cluster-locks-and-ownership"
    )


# ---- the README ------------------------------------------------------------------------


def test_the_readme_reads_in_five_minutes() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_ci_runs_exactly_the_readme_test_command() -> None:
    blocks = [body for _, before, body in fenced_blocks(README.read_text(), "sh")]
    assert "bash .ci/test\n" in blocks
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [ln for ln in run if ln.strip() and not ln.startswith(("#", "set ", "cd "))]
    assert [shlex.split(c) for c in commands] == [["exec", "bash", ".ci/test"]]


def test_every_readme_shell_block_runs_or_says_why_not() -> None:
    runnable = [body for _, body in doctools.runnable_readme_blocks()]
    for line, before, body in readme_shell_blocks():
        reason = NOT_RUN.search(before)
        assert reason or body in runnable, f"README.md:{line}"
        if reason:
            assert len(reason.group("reason").split()) >= 3, f"README.md:{line}: say why"
    tour = [b for b in runnable if "cvs sandbox up" in b]
    assert len(tour) == 1, "the tour: one runnable block that builds its own sandbox"
    for step in ("cvs status", "cvs up", "cvs exec", "cvs run install_demo", "cvs run test_demo"):
        assert step in tour[0], step
    assert tour[0].index("cvs run install_demo") < tour[0].index("cvs run test_demo")
    assert "cvs down" in tour[0] and tour[0].rstrip().endswith("cvs sandbox down --dir ./sandbox")


# ---- the design page ---------------------------------------------------------------------

DESIGN = ROOT / "docs" / "design.md"
DESIGN_LINES = 400  # the map, read in one sitting; figures and stories go to performance.md


def test_the_design_page_is_a_map_of_at_most_400_lines() -> None:
    lines = len(DESIGN.read_text().splitlines())
    assert lines <= DESIGN_LINES, (
        f"docs/design.md has {lines} lines (at most {DESIGN_LINES}): move measurements and "
        "their stories to docs/performance.md, a user's details to the user's page"
    )


def test_every_file_the_design_page_names_exists() -> None:
    package = ROOT / "orchestrator"
    by_name = {p.name for p in package.rglob("*") if p.suffix in (".py", ".sh")}
    named = set(re.findall(r"[\w./-]+\.(?:py|sh)\b", DESIGN.read_text()))
    missing = sorted(
        n
        for n in named
        if not ((ROOT / n).exists() or (package / n).exists() or ("/" not in n and n in by_name))
    )
    assert not missing, f"docs/design.md names files that are not there: {missing}"
